"""What Serve's proxy runs of ours (deployments/proxy_callback.py, request_id.py), without Ray:
the callback's middlewares, and the request-id rule on a real ASGI app."""

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


def test_the_callback_returns_the_request_id_middleware_and_bounds_the_headers(monkeypatch):
    pytest.importorskip("uvicorn")
    import uvicorn.config

    import deployments.header_timeout as header_timeout
    from deployments.proxy_callback import PROXY_CALLBACK, proxy_middlewares

    monkeypatch.setitem(uvicorn.config.HTTP_PROTOCOLS, "auto", uvicorn.config.HTTP_PROTOCOLS["auto"])
    monkeypatch.setattr(header_timeout, "BoundedHeadersProtocol", None)
    monkeypatch.setenv(header_timeout.HEADER_TIMEOUT_ENV, "4")
    (middleware,) = proxy_middlewares()
    assert middleware.cls is SafeRequestId
    assert uvicorn.config.HTTP_PROTOCOLS["auto"] == "deployments.header_timeout:BoundedHeadersProtocol"
    assert header_timeout.BoundedHeadersProtocol is not None and header_timeout.BoundedHeadersProtocol.header_timeout_s == 4.0
    module, name = PROXY_CALLBACK.split(":")
    assert getattr(__import__(module, fromlist=[name]), name) is proxy_middlewares  # the path Serve imports
