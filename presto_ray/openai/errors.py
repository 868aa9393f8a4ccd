"""Error bodies and the transport rules: every non-200 answer's shape, the bearer token, the
content type, and the 500 that never carries internals. Pure functions the ingress calls."""

from __future__ import annotations

import hmac
import logging
import re
import uuid
from collections.abc import Sequence
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


def client_disconnected(request_id: str | None, where: str) -> None:
    """A client that went away mid-request: not the service's failure, so one log line, no
    traceback and no error id (the ingress counts it in /v1/stats' client_disconnects)."""
    log.info("client disconnected (request %s) %s", request_id or "-", where)


# OpenAI's error types for the statuses the HTTP layer itself answers (unknown route, method, ...)
HTTP_ERROR_TYPES = {404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error", 413: "invalid_request_error",
                    415: "invalid_request_error", 431: "invalid_request_error"}  # fmt: skip


def http_error(status: int, detail: str | None = None, headers: dict[str, str] | None = None) -> ApiError:
    """An error the routing layer raised (404 unknown path, 405 wrong method, ...) in OpenAI's shape
    rather than Starlette's `{"detail": ...}`."""
    messages = {404: "no such route", 405: "method not allowed on this route"}
    message = messages.get(status) or detail or "invalid request"
    kind = HTTP_ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return ApiError(status, message, None, kind, headers)


REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")


def safe_request_id(value: str | None) -> str | None:
    """A client's X-Request-Id, only when it is short and safe to log and echo; None otherwise
    (the caller then uses an id of its own)."""
    if value is not None and REQUEST_ID_PATTERN.fullmatch(value):
        return value
    return None


def check_headers(headers: Sequence[tuple[bytes, bytes]], max_count: int, max_bytes: int) -> None:
    """Bounds on the request's headers (431), and headers that must come once: a second
    Authorization, Content-Type or Content-Length is ambiguous (which one did a proxy check?)."""
    if len(headers) > max_count:
        raise ApiError(431, f"the request has {len(headers)} headers; the limit is {max_count}")
    size = sum(len(k) + len(v) + 4 for k, v in headers)
    if size > max_bytes:
        raise ApiError(431, f"the request's headers are {size} bytes; the limit is {max_bytes}")
    seen: set[bytes] = set()
    for key, _ in headers:
        name = key.lower()
        if name in SINGLE_HEADERS:
            if name in seen:
                raise ApiError(400, f"the {name.decode()} header is sent more than once: send it once")
            seen.add(name)


SINGLE_HEADERS = frozenset({b"authorization", b"content-type", b"content-length", b"host"})


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


def check_content_encoding(values: Sequence[str]) -> None:
    """A POST body is read as it arrives: a `Content-Encoding` other than identity (gzip, br, ...)
    is a 415 naming it, with `Accept-Encoding: identity` (RFC 7694), rather than its bytes read
    as JSON (a plain body labelled gzip was accepted; a gzip one was a 400 about UTF-8)."""
    codings = [c.strip().lower() for value in values for c in value.split(",")]
    refused = [c for c in codings if c not in ("", "identity")]
    if refused:
        shown = ", ".join(dict.fromkeys(refused))
        message = f"Content-Encoding {shown} is not supported: send the JSON body as it is (identity)"
        raise ApiError(415, message, None, "invalid_request_error", {"Accept-Encoding": "identity"})


def check_transfer_encoding(values: Sequence[str]) -> None:
    """Only `chunked` framing is read: a transfer coding before it (`gzip, chunked`, which llhttp
    passes on undecoded) is a 501, as RFC 9112 asks of a coding the server does not understand."""
    codings = [c.strip().lower() for value in values for c in value.split(",")]
    refused = [c for c in codings if c not in ("", "chunked")]
    if refused:
        shown = ", ".join(dict.fromkeys(refused))
        raise ApiError(501, f"Transfer-Encoding {shown} is not supported: only chunked", None, "invalid_request_error")


def check_content_type(content_type: str | None) -> None:
    """POST bodies must say they are JSON: a browser form (urlencoded, multipart, text/plain) could
    otherwise start sampling cross-origin without a CORS preflight."""
    media_type, *params = (content_type or "").split(";")
    media_type = media_type.strip().lower()
    if media_type != "application/json":
        shown = media_type or "none"
        raise ApiError(415, f"Content-Type must be application/json (got {shown})", None, "invalid_request_error")
    for param in params:  # JSON is UTF-8 (RFC 8259): any other charset is refused, not guessed at
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            message = f"the body must be UTF-8 JSON (Content-Type says charset={value.strip()})"
            raise ApiError(415, message, None, "invalid_request_error")
