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


# --- what the parser refuses, in OpenAI's error shape (deployments/parser_errors.py) -------------
JSON_POST = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
# (request, status under httptools, status under h11); None: that parser takes it (the app answers)
REFUSED = {
    "bad Content-Length": (JSON_POST + b"Content-Length: abc\r\n\r\n{}", 400, 400),
    "negative Content-Length": (JSON_POST + b"Content-Length: -5\r\n\r\n{}", 400, 400),
    "two Content-Lengths": (JSON_POST + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400, 400),
    "Content-Length and Transfer-Encoding": (JSON_POST + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 400, None),
    "bad chunk size": (JSON_POST + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", 400, 400),
    "chunk longer than its size": (JSON_POST + b"Transfer-Encoding: chunked\r\n\r\n1\r\n{}\r\n0\r\n\r\n", 400, 400),
    "gzip transfer coding": (JSON_POST + b"Transfer-Encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", None, 501),
    "NUL in a header": (b"GET / HTTP/1.1\r\nHost: x\r\nX-Secret-A: a\x00b\r\n\r\n", 400, 400),
    "bare CR in a header": (b"GET / HTTP/1.1\r\nHost: x\r\nX-Secret-A: a\rb\r\n\r\n", 400, 400),
    "space in a header name": (b"GET / HTTP/1.1\r\nHost: x\r\nX Secret: 1\r\n\r\n", 400, 400),
    "unknown method": (b"FOO / HTTP/1.1\r\nHost: x\r\n\r\n", 501, None),
    "malformed method": (b"G(T / HTTP/1.1\r\nHost: x\r\n\r\n", 400, 400),
    "100 kB URL": (b"GET /?" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, None),
    "non-ASCII URL": (b"GET /a\xffb HTTP/1.1\r\nHost: x\r\n\r\n", 400, 400),
    "HTTP/9.9": (b"GET / HTTP/9.9\r\nHost: x\r\n\r\n", 505, None),
    "binary garbage": (bytes(range(256)), 400, 400),
}  # fmt: skip


def test_requests_the_parser_refuses_get_the_openai_error_shape(bounded_uvicorn, request):
    """Stock uvicorn answers each of these with a plain-text 400 ("Invalid HTTP request
    received."); the proxy's protocol answers OpenAI's error body, a status that says why, and
    closes the connection. The parser's reason is kept, the client's bytes never."""
    import json

    host, port = bounded_uvicorn
    parser = request.node.callspec.params["bounded_uvicorn"]
    answered = 0
    for name, (head, httptools_status, h11_status) in REFUSED.items():
        status = httptools_status if parser == "httptools" else h11_status
        s = raw_request(host, port, head, 5)
        answer = read_until_closed(s, time.monotonic() + (5 if status else 0.5))  # (a 200 keeps it open)
        s.close()
        if status is None:
            assert answer.startswith(b"HTTP/1.1 200"), (name, answer[:200])
            continue
        assert answer.startswith(f"HTTP/1.1 {status} ".encode()) and answer.endswith(b"<closed>"), (name, answer[:300])
        head_part, _, body = answer.removesuffix(b"<closed>").partition(b"\r\n\r\n")
        assert b"content-type: application/json" in head_part.lower() and b"connection: close" in head_part.lower(), name
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error", (name, error)
        assert error["message"] and "Invalid HTTP request received" not in error["message"], (name, error)
        assert "Secret" not in error["message"] and "\\x" not in error["message"], (name, error)
        answered += 1
    assert answered >= 11
    # and the server serves on
    s = raw_request(host, port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 5)
    assert read_until_closed(s, time.monotonic() + 1).startswith(b"HTTP/1.1 200")
    s.close()


def test_parser_refusals_say_why_without_the_clients_bytes():
    from deployments.parser_errors import parser_refusal

    class RemoteProtocolError(Exception):  # h11's, by its attributes
        def __init__(self, message: str, error_status_hint: int = 400) -> None:
            super().__init__(message)
            self.error_status_hint = error_status_hint

    status, message = parser_refusal(RemoteProtocolError("illegal header line: bytearray(b'X-Api-Key: hunter2')"))
    assert status == 400 and message == "malformed HTTP request: illegal header line"
    assert parser_refusal(RemoteProtocolError("Receive buffer too long", 431))[0] == 431
    assert parser_refusal(RemoteProtocolError("Only Transfer-Encoding: chunked is supported", 501))[0] == 501
    assert parser_refusal(None) == (400, "malformed HTTP request: unreadable request")
