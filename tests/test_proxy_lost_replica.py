"""Issue 33, item 3, without Ray: when Serve's proxy loses the replica answering a request (its
node died), it sends nothing more, and uvicorn answered a plain 'Internal Server Error' or cut the
stream. deployments/proxy_errors.py's middleware answers a 503 in OpenAI's shape saying to retry,
or ends the stream with an error event. (The same through a real cluster losing the ingress's
node: tests/test_multinode_serve.py.)"""

from __future__ import annotations

import asyncio
import json

from deployments.proxy_errors import RETRY_AFTER_S, OpenAIErrorAnswers

STREAM = [(b"content-type", b"text/event-stream")]


def through_the_middleware(app) -> list[dict]:
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(OpenAIErrorAnswers(app)({"type": "http", "headers": []}, receive, send))
    return sent


def test_a_request_whose_replica_was_lost_gets_a_503_saying_to_retry():
    async def lost_before_answering(scope, receive, send):  # Serve's proxy after a RayActorError
        return None

    start, end = through_the_middleware(lost_before_answering)
    headers = dict(start["headers"])
    assert start["status"] == 503 and headers[b"retry-after"] == str(RETRY_AFTER_S).encode()
    assert headers[b"content-type"] == b"application/json" and int(headers[b"content-length"]) == len(end["body"])
    error = json.loads(end["body"])["error"]
    assert "retry" in error["message"] and error["type"] == "server_error" and not end["more_body"]


def test_a_stream_whose_replica_was_lost_ends_with_an_error_event():
    async def lost_mid_stream(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": STREAM})
        await send({"type": "http.response.body", "body": b'data: {"choices": []}\n\n', "more_body": True})

    start, first, last = through_the_middleware(lost_mid_stream)
    assert start["status"] == 200 and first["body"].startswith(b"data: {") and not last["more_body"]
    assert last["body"].startswith(b"data: ") and last["body"].endswith(b"\n\n")
    error = json.loads(last["body"][len(b"data: "):])["error"]
    assert "retry" in error["message"] and error["type"] == "server_error"


def test_answers_that_end_are_left_as_they_are():
    async def whole(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": STREAM})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    assert [m.get("body") for m in through_the_middleware(whole)] == [None, b"data: [DONE]\n\n"]
