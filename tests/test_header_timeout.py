"""The proxy's bound on the time to send a request's headers (deployments/header_timeout.py), on
a real uvicorn in this process, with each of its HTTP parsers. No Ray: over Serve's proxy the
same bound is tested in tests/test_serve.py."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from raw_sockets import PARTIAL_HEAD, raw_request, read_until_closed
from waiting import wait_for

uvicorn = pytest.importorskip("uvicorn")

BOUND_S = 0.5


async def echo(scope, receive, send):
    """The body back after "ok"."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body) + 2).encode())]})
    await send({"type": "http.response.body", "body": b"ok" + body})


@pytest.fixture(params=["httptools", "h11"])
def bounded_uvicorn(request):
    """uvicorn (as in Serve's proxy) with each HTTP protocol bounded by bounded_headers_protocol
    at BOUND_S, serving `echo` in a thread; yields (host, port)."""
    from deployments.header_timeout import bounded_headers_protocol

    if request.param == "httptools":
        pytest.importorskip("httptools")
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    else:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    protocol = bounded_headers_protocol(base, BOUND_S)
    server = uvicorn.Server(uvicorn.Config(echo, host="127.0.0.1", port=port, http=protocol, lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 10, "uvicorn to start")
    yield "127.0.0.1", port
    server.should_exit = True
    thread.join(10)


def test_uvicorn_with_bounded_headers_closes_stalled_heads_and_serves_the_rest(bounded_uvicorn):
    """A connection that sends nothing, or part of its headers, gets 408 and is closed at the
    bound; a slow body is not the proxy's to bound (the ingress answers it 408); a kept-alive
    connection idles as uvicorn lets it, and its next request's headers get the same bound."""
    host, port = bounded_uvicorn
    started = time.monotonic()
    silent, partial = raw_request(host, port, b"", 5), raw_request(host, port, PARTIAL_HEAD, 5)
    for s in (silent, partial):
        answer = read_until_closed(s, started + 3)
        assert answer.startswith(b"HTTP/1.1 408") and b'"timeout_error"' in answer and answer.endswith(b"<closed>"), answer
        s.close()
    assert time.monotonic() - started < 2.0
    # headers in time, the body after the bound: nothing said and the connection open past the
    # bound, then answered
    s = raw_request(host, port, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n", 5)
    assert read_until_closed(s, time.monotonic() + BOUND_S + 0.3) == b""
    s.sendall(b"hi")
    assert read_until_closed(s, time.monotonic() + 0.5).startswith(b"HTTP/1.1 200")
    # kept alive past the bound (nothing said, not closed), then a next request whose headers
    # stall: 408, closed
    assert read_until_closed(s, time.monotonic() + BOUND_S + 0.3) == b""
    s.sendall(b"GET / HTTP")
    answer = read_until_closed(s, time.monotonic() + 2)
    s.close()
    assert answer.startswith(b"HTTP/1.1 408") and answer.endswith(b"<closed>"), answer


def test_bound_header_reads_points_uvicorns_default_protocol_at_the_bounded_one(monkeypatch):
    """What the proxy callback does in the proxy's process: uvicorn's "auto" names a protocol
    that is uvicorn's own with the bound mixed in (nothing happens on import)."""
    import uvicorn.config
    from uvicorn.importer import import_from_string
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    import deployments.header_timeout as header_timeout

    monkeypatch.setitem(uvicorn.config.HTTP_PROTOCOLS, "auto", uvicorn.config.HTTP_PROTOCOLS["auto"])
    monkeypatch.setattr(header_timeout, "BoundedHeadersProtocol", None)
    assert uvicorn.config.HTTP_PROTOCOLS["auto"] == "uvicorn.protocols.http.auto:AutoHTTPProtocol"
    header_timeout.bound_header_reads(2.5)
    protocol = import_from_string(uvicorn.config.HTTP_PROTOCOLS["auto"])
    assert issubclass(protocol, AutoHTTPProtocol) and issubclass(protocol, header_timeout.HeaderDeadline)
    assert protocol.header_timeout_s == 2.5 and b"within 2.5 s" in protocol.late_answer


def test_the_bound_comes_from_the_environment(monkeypatch):
    from deployments.header_timeout import HEADER_TIMEOUT_ENV, header_timeout_from_env

    monkeypatch.delenv(HEADER_TIMEOUT_ENV, raising=False)
    assert header_timeout_from_env() == 10.0
    monkeypatch.setenv(HEADER_TIMEOUT_ENV, "3")
    assert header_timeout_from_env() == 3.0
