"""A bound on the time a client takes to send a request's headers, for uvicorn in Serve's proxy.

uvicorn sets no timer while a request's headers arrive (its keep-alive timer runs only between a
response and the next request's first byte, and none runs on a new connection), so a client that
opens a connection and sends nothing, or part of its headers, holds it for as long as it likes.

Why this patches uvicorn rather than configuring it: Ray Serve's proxy builds its own
`uvicorn.Config` (ray/serve/_private/http_util.py, `start_asgi_http_server`) with the protocol left
at "auto", and offers no setting for the protocol class or a header timeout (its `HTTPOptions`
have `keep_alive_timeout_s` and nothing for headers). The one piece of our code that runs in the
proxy's process before its uvicorn starts is the proxy callback (deployments/proxy_callback.py),
so that callback calls `bound_header_reads` once, which points uvicorn's "auto" protocol at
`BoundedHeadersProtocol` (uvicorn loads protocols by import string, from `HTTP_PROTOCOLS`).
Importing this module changes nothing; only that call does, and only in the process it runs in.
The same class answers what uvicorn's parser refuses in OpenAI's error shape
(deployments/parser_errors.py): it is the one protocol class of ours the proxy runs.
"""

from __future__ import annotations

import asyncio
import os
from typing import cast

from deployments.parser_errors import OpenAIParserErrors, error_answer

HEADER_TIMEOUT_ENV = "PRESTO_RAY_HEADER_TIMEOUT_S"
DEFAULT_HEADER_TIMEOUT_S = 10.0

# what uvicorn's "auto" names once bound_header_reads ran (uvicorn imports it by name)
BoundedHeadersProtocol: type[asyncio.Protocol] | None = None


def header_timeout_from_env() -> float:
    """The bound the proxy's process was started with (PRESTO_RAY_HEADER_TIMEOUT_S), 10 s unset."""
    return float(os.environ.get(HEADER_TIMEOUT_ENV) or DEFAULT_HEADER_TIMEOUT_S)


def bound_header_reads(timeout_s: float) -> None:
    """In this process, uvicorn's default HTTP protocol becomes one that answers 408 and closes a
    connection whose request headers have not all arrived `timeout_s` seconds after it opened
    (or after the first byte of a next request on a kept-alive connection), and answers a
    request its parser refuses in OpenAI's error shape. Call it once, before uvicorn starts; a
    second call replaces the bound."""
    global BoundedHeadersProtocol
    import uvicorn.config
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    BoundedHeadersProtocol = bounded_headers_protocol(AutoHTTPProtocol, timeout_s)
    uvicorn.config.HTTP_PROTOCOLS["auto"] = f"{__name__}:BoundedHeadersProtocol"


def timeout_answer(timeout_s: float) -> bytes:
    """The whole 408 response a late connection gets, in OpenAI's error shape, before it is closed."""
    return error_answer(408, f"the request headers did not arrive within {timeout_s:g} s", "timeout_error")


class HeaderDeadline(asyncio.Protocol):
    """Mixed in before a uvicorn HTTP protocol (httptools or h11): a deadline for each request's
    headers. A request is under way from its headers' end (uvicorn's `cycle`) until its response
    is complete; the body's time is the ingress's (serve.request_read_timeout_s, a 408). It leans
    on what both of uvicorn's protocols have: `loop`, `transport`, and `cycle.response_complete`."""

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    late_answer: bytes = b""
    _header_deadline: asyncio.TimerHandle | None = None
    loop: asyncio.AbstractEventLoop  # set by the uvicorn protocol
    transport: asyncio.Transport  # set by the uvicorn protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._header_deadline is None and not self._in_request():
            self._arm()  # the first bytes of a next request on a kept-alive connection
        super().data_received(data)
        if self._in_request():
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _in_request(self) -> bool:
        cycle = getattr(self, "cycle", None)
        return cycle is not None and not cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_late(self) -> None:
        self._header_deadline = None
        if self._in_request() or self.transport.is_closing():
            return
        self.transport.write(self.late_answer)
        self.transport.close()


def bounded_headers_protocol(base: type[asyncio.Protocol], timeout_s: float) -> type[asyncio.Protocol]:
    """`base` (uvicorn's httptools or h11 protocol) with a deadline of `timeout_s` for each
    request's headers and its parser's refusals in OpenAI's shape: HeaderDeadline and
    OpenAIParserErrors mixed in before it."""
    name = f"BoundedHeaders{base.__name__}"
    namespace = {"header_timeout_s": timeout_s, "late_answer": timeout_answer(timeout_s), "__module__": __name__, "__qualname__": name}
    # type() is typed as returning a bare `type`; this one is a subclass of `base`
    return cast(type[asyncio.Protocol], type(name, (HeaderDeadline, OpenAIParserErrors, base), namespace))
