"""The client's X-Request-Id, kept only when it is safe to log and echo (Serve's proxy, plain ASGI)."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from presto_ray.openai import safe_request_id

REQUEST_ID_HEADER = b"x-request-id"


class SafeRequestId:
    """In Serve's proxy, before its request-id middleware: a client's X-Request-Id is kept only
    when it matches [A-Za-z0-9._-]{1,64}; otherwise it is dropped and Serve generates one, so
    no client-chosen text reaches the logs or is echoed back. Two of them are dropped too."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            headers = scope["headers"]
            values = [v for k, v in headers if k.lower() == REQUEST_ID_HEADER]
            if values and (len(values) > 1 or safe_request_id(values[0].decode("latin-1")) is None):
                scope = {**scope, "headers": [(k, v) for k, v in headers if k.lower() != REQUEST_ID_HEADER]}
        await self.app(scope, receive, send)
