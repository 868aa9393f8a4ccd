"""What Serve's proxy runs of ours (deployments/proxy_callback.py, request_id.py,
proxy_errors.py), without Ray: the callback's middlewares, the request-id rule and the proxy's
error answers on a real ASGI app."""

from __future__ import annotations

import asyncio

import pytest

from deployments.request_id import SafeRequestId


def ids_seen(headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    """The X-Request-Id values the app behind SafeRequestId sees."""
    seen: list[bytes] = []

    async def app(scope, receive, send):
        seen.extend(v for k, v in scope["headers"] if k.lower() == b"x-request-id")

    async def receive() -> dict:
        return {}

    async def send(message: dict) -> None:
        pass

    asyncio.run(SafeRequestId(app)({"type": "http", "headers": headers}, receive, send))
    return seen


def test_only_safe_request_ids_pass():
    assert ids_seen([(b"x-request-id", b"client-id_1.2")]) == [b"client-id_1.2"]
    assert ids_seen([(b"X-Request-Id", b"A" * 64), (b"host", b"x")]) == [b"A" * 64]
    for unsafe in (b"<script>alert(1)</script>", b"a" * 65, b"has space", b'{"json":1}', b""):
        assert ids_seen([(b"x-request-id", unsafe), (b"host", b"x")]) == [], unsafe
    assert ids_seen([(b"x-request-id", b"one"), (b"x-request-id", b"two")]) == []  # which one? neither
    assert ids_seen([(b"host", b"x")]) == []


def test_the_callback_returns_its_middlewares_and_bounds_the_headers(monkeypatch):
    pytest.importorskip("uvicorn")
    import uvicorn.config

    import deployments.header_timeout as header_timeout
    from deployments.proxy_callback import PROXY_CALLBACK, proxy_middlewares

    monkeypatch.setitem(uvicorn.config.HTTP_PROTOCOLS, "auto", uvicorn.config.HTTP_PROTOCOLS["auto"])
    monkeypatch.setattr(header_timeout, "BoundedHeadersProtocol", None)
    monkeypatch.setenv(header_timeout.HEADER_TIMEOUT_ENV, "4")
    from deployments.proxy_errors import OpenAIErrorAnswers

    assert [middleware.cls for middleware in proxy_middlewares()] == [SafeRequestId, OpenAIErrorAnswers]
    assert uvicorn.config.HTTP_PROTOCOLS["auto"] == "deployments.header_timeout:BoundedHeadersProtocol"
    assert header_timeout.BoundedHeadersProtocol is not None and header_timeout.BoundedHeadersProtocol.header_timeout_s == 4.0
    module, name = PROXY_CALLBACK.split(":")
    assert getattr(__import__(module, fromlist=[name]), name) is proxy_middlewares  # the path Serve imports


def answered(status: int, headers: list[tuple[bytes, bytes]], chunks: list[bytes]) -> tuple[dict, bytes]:
    """What leaves OpenAIErrorAnswers when the app behind it answers `status` in `chunks`."""
    from deployments.proxy_errors import OpenAIErrorAnswers

    sent: list[dict] = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": status, "headers": headers})
        for i, chunk in enumerate(chunks):
            await send({"type": "http.response.body", "body": chunk, "more_body": i < len(chunks) - 1})

    async def receive() -> dict:
        return {}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(OpenAIErrorAnswers(app)({"type": "http", "headers": []}, receive, send))
    return sent[0], b"".join(m.get("body", b"") for m in sent[1:])


def test_serves_plain_text_errors_leave_the_proxy_in_the_openai_shape():
    """Serve's proxy answers a path no application serves, a deploying application, a timeout,
    in plain text: they leave with OpenAI's error body, the status and other headers kept."""
    import json

    plain = [(b"content-type", b"text/plain; charset=utf-8"), (b"x-request-id", b"abc")]
    for status, chunks, words in [
        (404, [b"Path '/nope' not found. Ping http://127.0.0.1:8000/-/routes for available routes."], "no such route"),
        (503, [b"Service unavailable: ", b"no replica\n"], "Service unavailable: no replica"),
        (408, [b"Request abc timed out after 5.0s."], "timed out"),
    ]:
        start, body = answered(status, plain, chunks)
        headers = dict(start["headers"])
        assert start["status"] == status and headers[b"content-type"] == b"application/json" and headers[b"x-request-id"] == b"abc"
        assert int(headers[b"content-length"]) == len(body)
        error = json.loads(body)["error"]
        assert words in error["message"] and set(error) == {"message", "type", "param", "code"}, error
    assert json.loads(answered(503, plain, [b"x"])[1])["error"]["type"] == "server_error"
    # the ingress's answers (JSON, event streams, successes) pass as they are
    for status, headers, chunks in [
        (400, [(b"content-type", b"application/json")], [b'{"error": {}}']),
        (200, [(b"content-type", b"text/plain")], [b"success"]),
        (200, [(b"content-type", b"text/event-stream")], [b"data: 1\n\n", b"data: 2\n\n"]),
    ]:
        start, body = answered(status, headers, chunks)
        assert start["headers"] == headers and body == b"".join(chunks)
