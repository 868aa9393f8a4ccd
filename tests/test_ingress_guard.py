"""IngressGuard (deployments/ingress_guard.py) as plain ASGI, without Ray: what it lets through,
what it answers itself, and a receive channel Ray cancelled read as the client's disconnect."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray")  # TaskCancelledError is Ray's: no Ray is started
from ray.exceptions import TaskCancelledError  # noqa: E402

from deployments.ingress_guard import IngressGuard  # noqa: E402
from presto_ray.serve_config import ServeConfig  # noqa: E402


def http_scope(headers: list[tuple[bytes, bytes]]) -> dict:
    return {"type": "http", "method": "POST", "path": "/", "headers": headers}


def run(app, scope: dict, receive) -> list[dict]:
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(IngressGuard(app, ServeConfig(max_headers=8), "r-7")(scope, receive, send))
    return sent


def test_a_cancelled_receive_is_the_clients_disconnect_from_then_on():
    heard: list[dict] = []

    async def app(scope, receive, send):
        heard.extend([await receive(), await receive()])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"a", b"b")]})
        await send({"type": "http.response.body", "body": b""})

    calls = 0

    async def receive() -> dict:
        nonlocal calls
        calls += 1
        raise TaskCancelledError()

    sent = run(app, http_scope([(b"host", b"x")]), receive)
    assert heard == [{"type": "http.disconnect"}] * 2 and calls == 1  # not asked again once gone
    assert sent[0]["headers"] == [(b"a", b"b"), (b"x-presto-ingress-replica", b"r-7")]


def test_bad_headers_are_answered_by_the_guard_and_never_reach_the_app():
    async def app(scope, receive, send):
        raise AssertionError("the app was called")

    async def receive() -> dict:
        return {"type": "http.request", "body": b""}

    for headers, status in [([(f"x-{i}".encode(), b"v") for i in range(9)], 431), ([(b"content-type", b"a")] * 2, 400)]:
        start = run(app, http_scope(headers), receive)[0]
        assert start["status"] == status and (b"x-presto-ingress-replica", b"r-7") in start["headers"], start


def test_other_scopes_pass_untouched():
    seen: list[dict] = []

    async def app(scope, receive, send):
        seen.append(scope)

    async def receive() -> dict:
        return {}

    lifespan = {"type": "lifespan"}
    run(app, lifespan, receive)
    assert seen == [lifespan]
