"""Serve's proxy's own error answers in OpenAI's shape (in the proxy, plain ASGI).

Serve's HTTP proxy answers some requests itself, in plain text, before any replica sees them: a
path no application's route prefix matches (404 "Path '...' not found"), an application that is
deploying or has no replica (503), a request over `http_options.request_timeout_s` (408), a
replica queue over `max_queued_requests` (503), a replica that died mid-request (500). The proxy
callback (deployments/proxy_callback.py) puts this middleware around the proxy's ASGI app, where
those answers pass: an error status whose body is not JSON becomes OpenAI's error body, with the
status and the other headers kept. The ingress's own answers are JSON (and event streams are
200s), so they pass through untouched.

A replica lost with its node (or killed) mid-request is another case: Serve's proxy then sends
nothing at all (a 500 before the response started, or the rest of a stream), and uvicorn, outside
this middleware, answered a plain `Internal Server Error` or cut the stream without its last chunk.
So when the proxy's app returns without having answered, this middleware answers a 503 in OpenAI's
shape saying to retry (with `Retry-After`), and a stream it left unfinished ends with an error event
in OpenAI's shape (`data: {"error": ...}`) instead of a cut connection.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from presto_ray.openai import http_error

MAX_TEXT_BYTES = 65536  # of a plain error body kept for the message (Serve's are a line)
_PASSED = (b"application/json", b"text/event-stream")
LOST_ANSWER = "the replica answering this request was lost (its node or process died) before it answered; retry"
LOST_STREAM = "the replica answering this stream was lost (its node or process died) before the stream ended; retry"
RETRY_AFTER_S = 1


def _plain_error(message: Message) -> bool:
    if message["status"] < 400:
        return False
    content_type = next((v for k, v in message.get("headers", ()) if k.lower() == b"content-type"), b"")
    return not content_type.lower().startswith(_PASSED)


def openai_body(status: int, text: bytes) -> bytes:
    """OpenAI's error body for a plain-text answer: its text (printable ASCII, one line, at most
    200 characters) as the message, or the route's fixed message (404, 405)."""
    line = "".join(c for c in text.decode("utf-8", "replace") if " " <= c <= "~").strip()[:200]
    return json.dumps(http_error(status, line or None).body()).encode()


def _content_type(message: Message) -> bytes:
    return next((v for k, v in message.get("headers", ()) if k.lower() == b"content-type"), b"").lower()


def lost_answer() -> list[Message]:
    """The 503 sent for a request whose replica was lost before the response started."""
    body = json.dumps(http_error(503, LOST_ANSWER).body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"retry-after", str(RETRY_AFTER_S).encode())]  # fmt: skip
    return [{"type": "http.response.start", "status": 503, "headers": headers},
            {"type": "http.response.body", "body": body, "more_body": False}]  # fmt: skip


def lost_stream_end(event_stream: bool) -> Message:
    """The last chunk of a response cut short: an event stream's error event in OpenAI's shape."""
    body = b""
    if event_stream:
        body = b"data: " + json.dumps(http_error(503, LOST_STREAM).body()).encode() + b"\n\n"
    return {"type": "http.response.body", "body": body, "more_body": False}


class OpenAIErrorAnswers:
    """Every error answer that leaves the proxy has OpenAI's error body, and every response ends."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: Message | None = None  # a plain error's start, sent once its body is replaced
        text = b""
        started = ended = event_stream = False

        async def shaped(message: Message) -> None:
            nonlocal held, text, started, ended, event_stream
            if message["type"] == "http.response.start":
                started, event_stream = True, _content_type(message).startswith(b"text/event-stream")
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                ended = True
            if message["type"] == "http.response.start" and _plain_error(message):
                held = message
                return
            if held is None or message["type"] != "http.response.body":
                await send(message)
                return
            text = (text + message.get("body", b""))[:MAX_TEXT_BYTES]
            if message.get("more_body", False):
                return
            body = openai_body(held["status"], text)
            kept = [(k, v) for k, v in held.get("headers", ()) if k.lower() not in (b"content-type", b"content-length")]
            headers = [*kept, (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({**held, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            held = None

        await self.app(scope, receive, shaped)
        if held is not None:  # a plain error whose body never came
            await shaped({"type": "http.response.body", "body": b"", "more_body": False})
        elif not started:  # Serve's proxy lost the replica before it answered
            for message in lost_answer():
                await send(message)
        elif not ended:  # ... or mid-response
            await send(lost_stream_end(event_stream))
