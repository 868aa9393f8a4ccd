"""A request's body, read as the ingress allows it: bounded in size (413) and in time (408)."""

from __future__ import annotations

import asyncio

from starlette.requests import Request

from presto_ray.openai import ApiError


async def read_body(request: Request, max_bytes: int, timeout_s: float) -> bytes:
    """The body, at most `max_bytes` (a declared or an actual larger one gets 413) and within
    `timeout_s` (serve.request_read_timeout_s: a stalled or trickling client gets 408 and the
    connection is closed, so stalled clients do not hold the ingress)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise ApiError(413, f"request body is {declared} bytes; the limit is {max_bytes}")
    chunks, size = list[bytes](), 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                chunks.append(chunk)
                size += len(chunk)
                if size > max_bytes:
                    raise ApiError(413, f"request body is over the limit of {max_bytes} bytes")
    except TimeoutError:
        message = f"the request body did not arrive within {timeout_s:g} s"
        raise ApiError(408, message, None, "timeout_error", {"Connection": "close"}) from None
    return b"".join(chunks)
