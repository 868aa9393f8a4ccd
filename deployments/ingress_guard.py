"""The ingress's outermost ASGI layer: what every route gets before routing."""

from __future__ import annotations

from ray.exceptions import TaskCancelledError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from deployments.error_response import error_response
from presto_ray.openai import ApiError, check_headers
from presto_ray.serve_config import ServeConfig

REPLICA_HEADER = b"x-presto-ingress-replica"


class IngressGuard:
    """Every route, as plain ASGI (no BaseHTTPMiddleware: no task group and memory streams per
    request): bounded headers (431) and no second Authorization, Content-Type, Content-Length or
    Host (400), since uvicorn in Serve's proxy bounds neither the size nor the count of headers
    (`settings`: serve.max_headers, serve.max_header_bytes); the replica that answered in
    x-presto-ingress-replica (`replica_id`: operators, and the test that two replicas share a
    pool); and a receive channel that Ray cancelled (the client left, so Serve cancels the
    request and every call it made, its receive call included) read as the disconnect it is, not
    raised as TaskCancelledError out of Starlette's disconnect listener."""

    def __init__(self, app: ASGIApp, settings: ServeConfig, replica_id: str) -> None:
        self.app = app
        self.settings = settings
        self.replica = replica_id.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (REPLICA_HEADER, self.replica)]}
            await send(message)

        try:
            check_headers(scope["headers"], self.settings.max_headers, self.settings.max_header_bytes)
        except ApiError as e:
            await error_response(e)(scope, receive, tagged)
            return
        gone = False

        async def until_cancelled() -> Message:
            nonlocal gone
            if not gone:
                try:
                    return await receive()
                except TaskCancelledError:
                    gone = True
            return {"type": "http.disconnect"}

        await self.app(scope, until_cancelled, tagged)
