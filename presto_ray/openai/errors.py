"""Error bodies and the transport rules: every non-200 answer's shape, the bearer token, the
content type, and the 500 that never carries internals. Pure functions the ingress calls."""

from __future__ import annotations

import hmac
import logging
import uuid
from typing import Any

from pydantic import BaseModel

log = logging.getLogger("presto_ray.serve")


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class ApiError(Exception):
    """An error with its HTTP status and an OpenAI-style body naming the offending field."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.headers = headers or {}

    def response(self) -> ErrorResponse:
        return ErrorResponse(error=ErrorDetail(message=self.message, type=self.kind, param=self.param))

    def body(self) -> dict[str, Any]:
        return self.response().model_dump()


def internal_error(error: BaseException, request_id: str | None = None) -> ApiError:
    """A failure that is not the client's: logged here in full under an error id, answered with a
    500 that carries only that id (a traceback shows paths, hosts, pids and actor ids)."""
    error_id = f"err-{uuid.uuid4().hex[:16]}"
    log.error("%s (request %s): %s", error_id, request_id or "-", type(error).__name__, exc_info=error)
    return ApiError(500, f"internal server error; the server log has its details under {error_id}", None, "server_error")


def error_event(error: Exception, request_id: str | None = None) -> ErrorResponse:
    """The event a stream sends when a chain fails (the HTTP status is already 200)."""
    return internal_error(error, request_id).response()


def check_api_key(authorization: str | None, api_key: str | None) -> None:
    """`Authorization: Bearer <key>` when the service has a key: the scheme in any case (RFC 7235),
    the key compared in constant time. 401 with `WWW-Authenticate: Bearer` otherwise."""
    if not api_key:
        return
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise ApiError(
            401,
            "missing or wrong API key: send 'Authorization: Bearer <key>'",
            None,
            "invalid_api_key",
            {"WWW-Authenticate": 'Bearer realm="presto-ray"'},
        )


def check_content_type(content_type: str | None) -> None:
    """POST bodies must say they are JSON: a browser form (urlencoded, multipart, text/plain) could
    otherwise start sampling cross-origin without a CORS preflight."""
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        shown = media_type or "none"
        raise ApiError(415, f"Content-Type must be application/json (got {shown})", None, "invalid_request_error")
