"""The answer uvicorn in Serve's proxy gives a request its HTTP parser refused, in OpenAI's shape.

Stock uvicorn answers every request its parser (httptools, or h11) cannot read with a 400 whose
body is the plain text "Invalid HTTP request received.": a bad or doubled Content-Length, both
Content-Length and Transfer-Encoding, a malformed chunk, a NUL or a bare CR in a header, an
unknown method, a URL llhttp will not take. Those never reach the ingress (no ASGI app sees them),
so the one place to shape them is uvicorn's protocol object, where both of its protocols call
`send_400_response(msg)` from inside the `except` that caught the parser's error.
`OpenAIParserErrors`, mixed in before the protocol (deployments/header_timeout.py builds the
class the proxy uses), answers there instead: OpenAI's error body `{"error": {...}}`, a status
that says what was wrong (400; 414 for a URL over llhttp's 65,535 bytes; 431 for a request line
or headers over h11's buffer; 501 for a method llhttp does not know or a transfer coding h11
cannot read; 505 for an HTTP version llhttp refuses), `Connection: close`, and the connection
closed, as uvicorn did.

What it leans on: both protocols' `send_400_response`, `transport`, `server_state.default_headers`
and `cycle.response_started`; the parser's exception is the one being handled (`sys.exc_info`).
Neither parser is imported (the deployments import uvicorn, not its parsers): the error is read by
its type's name (httptools) or its `error_status_hint` (h11).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from http import HTTPStatus

from presto_ray.openai import ApiError

# a method token (RFC 9110): a request line that starts with one names a method llhttp does not
# know (501); anything else is not a request line at all (400)
_METHOD_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+ ")
# h11 puts the offending bytes in some messages ("illegal header line: bytearray(b'...')"): the
# answer keeps the parser's reason, never the client's bytes
_CLIENT_BYTES = re.compile(r":?\s*(bytearray\(|b'|b\").*$", re.DOTALL)


def error_answer(status: int, message: str, kind: str = "invalid_request_error", headers: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    """A whole HTTP/1.1 response carrying OpenAI's error body, after which the connection closes."""
    body = json.dumps(ApiError(status, message, None, kind).body()).encode()
    head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode()]
    head += [name + b": " + value for name, value in headers]
    head += [b"content-type: application/json", b"connection: close", b"content-length: " + str(len(body)).encode()]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def parser_refusal(error: BaseException | None, request_start: bytes = b"") -> tuple[int, str]:
    """The status and message for a request the parser refused with `error` (None: unknown);
    `request_start`: the first bytes of the request, when known (to tell an unknown method from
    a line that is no request line)."""
    kind = type(error).__name__
    if kind == "HttpParserCallbackError":  # uvicorn's callback raised: what it raised is the reason
        inner = error.__context__ if error is not None else None
        if type(inner).__name__ == "HttpParserInvalidURLError" and "too long" in str(inner):
            return 414, "the URL is too long: at most 65,535 bytes"  # llhttp's URL parser's limit
        error, kind = (inner, type(inner).__name__) if type(inner).__name__.startswith("HttpParser") else (None, "")
    reason = _CLIENT_BYTES.sub("", str(error or "")).strip()
    reason = "".join(c for c in reason if " " <= c <= "~")[:120] or "unreadable request"
    status = 400
    hint = getattr(error, "error_status_hint", None)  # h11's RemoteProtocolError
    if isinstance(hint, int) and 400 <= hint < 600:
        status = hint
    if status == 431:
        return 431, "malformed HTTP request: the request line or the headers are too long"
    if kind == "HttpParserInvalidMethodError" and _METHOD_TOKEN.match(request_start):
        return 501, "unknown HTTP method: this service answers GET and POST"
    if kind == "HttpParserError" and reason.lower() == "invalid http version":
        return 505, "HTTP version not supported: send HTTP/1.1"
    return status, f"malformed HTTP request: {reason}"


class OpenAIParserErrors(asyncio.Protocol):
    """Mixed in before a uvicorn HTTP protocol (httptools or h11): a request its parser refuses
    is answered with OpenAI's error body and a status that says why, and the connection closed."""

    transport: asyncio.Transport  # set by the uvicorn protocol
    _request_start: bytes = b""

    def data_received(self, data: bytes) -> None:
        cycle = getattr(self, "cycle", None)
        if cycle is None or cycle.response_complete:  # (maybe) the first bytes of a request
            self._request_start = data[:64]
        super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        """Called by uvicorn from inside the `except` that caught the parser's error."""
        cycle = getattr(self, "cycle", None)
        if cycle is not None and cycle.response_started and not cycle.response_complete:
            self.transport.close()  # an answer is under way: a second one cannot follow it
            return
        status, message = parser_refusal(sys.exc_info()[1], self._request_start)
        defaults = getattr(getattr(self, "server_state", None), "default_headers", ())
        self.transport.write(error_answer(status, message, headers=tuple(defaults)))
        self.transport.close()
