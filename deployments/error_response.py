"""An ApiError as the HTTP answer every layer of the ingress gives: OpenAI's error body, its status
and its headers (WWW-Authenticate, Connection: close, Allow, Retry-After), and the error a failure
of the service itself is answered with."""

from __future__ import annotations

import logging

from fastapi.responses import JSONResponse
from ray.exceptions import RayActorError

from presto_ray.openai import ApiError, internal_error

log = logging.getLogger("presto_ray.serve")

# seconds a client is asked to wait before retrying a request the service lost
RETRY_AFTER_S = 1
POOL_LOST = (
    "the sampling pool answering this request (its engines and coordinators) was lost, its node or process "
    "died, before it answered; retry"
)


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), error.status, headers=error.headers)


def service_error(error: BaseException, request_id: str | None = None, *, pool_replaced: bool = False) -> ApiError:
    """The answer to a request the service failed. A coordinator it was using died with the sampling
    pool that owns it (its node was lost, and Serve starts another pool: `pool_replaced`) is a 503
    saying to retry, with `Retry-After`, since a retry reaches the new pool; anything else (a
    coordinator dead for good while its pool lives, a bug) a 500 carrying only an error id
    (`internal_error`): a retry would not help."""
    if pool_replaced and isinstance(error, RayActorError):
        log.warning("request %s: lost its sampling pool (%s); answered 503, retry", request_id or "-", type(error).__name__)
        return ApiError(503, POOL_LOST, None, "server_error", {"Retry-After": str(RETRY_AFTER_S)})
    return internal_error(error, request_id)
