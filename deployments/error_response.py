"""An ApiError as the HTTP answer every layer of the ingress gives: OpenAI's error body, its status
and its headers (WWW-Authenticate, Connection: close, Allow)."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from presto_ray.openai import ApiError


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), error.status, headers=error.headers)
