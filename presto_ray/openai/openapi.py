"""The OpenAPI description of the POST routes: their documented body is the request model, their
answers the response and chunk models and the error body of each status."""

from __future__ import annotations

from typing import Any

from presto_ray.openai.errors import ErrorResponse
from presto_ray.openai.prepare import request_model
from presto_ray.openai.render import renderer

ERROR_STATUSES = {
    400: "A field is invalid or cannot be honoured: `error.param` names it.",
    401: "Missing or wrong bearer token.",
    404: "Another model was named.",
    413: "The body is over serve.max_body_bytes.",
    415: "The body is not application/json.",
    500: "Not the client's fault: the message names an error id in the server log.",
}


def openapi_route(chat: bool) -> dict[str, Any]:
    """The POST route's decorator arguments. The ingress reads and validates the body itself (401,
    413 and 415 come before parsing, and a 400 names the field), so the schema is declared rather
    than inferred."""
    api = renderer(chat)
    body = {"application/json": {"schema": _inline_refs(request_model(chat).model_json_schema())}}
    ok = {
        "model": api.response_model,
        "description": "The choices; with stream: true, server-sent events, each `data:` line one chunk, then `data: [DONE]`.",
        "content": {"text/event-stream": {"schema": _inline_refs(api.chunk_model.model_json_schema(mode="serialization"))}},
    }
    errors = {status: {"model": ErrorResponse, "description": d} for status, d in ERROR_STATUSES.items()}
    responses: dict[int, dict[str, Any]] = {200: ok, **errors}
    return {"openapi_extra": {"requestBody": {"required": True, "content": body}}, "responses": responses}


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """A model's JSON schema with its `$defs` written in place: an operation's schema cannot point
    into a `$defs` of its own (the request models have no recursive types)."""
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if (ref := node.get("$ref", "")).startswith("#/$defs/"):
                return inline(defs[ref.removeprefix("#/$defs/")])
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    result: dict[str, Any] = inline(schema)
    return result
