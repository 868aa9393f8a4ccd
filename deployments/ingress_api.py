"""The ingress's FastAPI application: its routes, the bearer token, and errors in OpenAI's shape.

Built once per ingress replica (`build_api`, from PrestoIngress's `__serve_build_asgi_app__`) with
everything it needs passed in: the replica's handlers, the `serve:` settings the guard bounds
headers by, the API key and the replica's id. Routes: POST /v1/completions, POST
/v1/chat/completions, GET /v1/models, GET /v1/stats, GET /health, and the API docs (/docs, /redoc,
/openapi.json). Every route but /health is behind the bearer token: one dependency,
`bearer_token`. FastAPI's own docs routes cannot see the key, so the app serves them itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from fastapi import Depends, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from deployments.error_response import error_response
from deployments.ingress_guard import IngressGuard
from presto_ray.openai import ApiError, check_api_key, http_error, openapi_route
from presto_ray.serve_config import ServeConfig


class IngressHandlers(Protocol):
    """What the routes call: the ingress replica's work (deployments/ingress.py)."""

    async def models(self) -> BaseModel: ...

    async def stats(self) -> BaseModel | JSONResponse: ...

    async def completion(self, request: Request, chat: bool) -> BaseModel | Response: ...


def bearer_token(api_key: str | None) -> Callable[[Request], Awaitable[None]]:
    """The dependency that guards a route: `Authorization: Bearer <api_key>` when the service has
    a key (401 with WWW-Authenticate otherwise, through the ApiError handler). Async, so FastAPI
    runs it on the event loop rather than in a thread."""

    async def authorized(request: Request) -> None:
        check_api_key(request.headers.get("authorization"), api_key)

    return authorized


def build_api(handlers: IngressHandlers, settings: ServeConfig, api_key: str | None, replica_id: str) -> FastAPI:
    """The application one ingress replica serves."""
    api = FastAPI(
        title="presto-ray",
        description="Exact power sampling, OpenAI-compatible.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        # no 307 to a Location built from the client's Host header: /v1/completions/ is a 404
        redirect_slashes=False,
    )
    api.add_middleware(IngressGuard, settings=settings, replica_id=replica_id)

    @api.exception_handler(StarletteHTTPException)
    async def _http_exception(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """Starlette's own answers (404 unknown route, 405 wrong method) in OpenAI's error shape."""
        return error_response(http_error(exc.status_code, str(exc.detail), dict(exc.headers or {})))

    @api.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        """An ApiError a dependency raised (the bearer token's 401)."""
        return error_response(exc)

    guarded = [Depends(bearer_token(api_key))]

    # The endpoints' names and (absent) docstrings are the OpenAPI schema's operation ids,
    # summaries and descriptions. response_model=None: FastAPI would read the return
    # annotations as response models (the bodies are built and validated by the library; the
    # POST routes' schema is openapi_route's). /health keeps its annotation as its documented
    # response.
    @api.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok"}

    @api.get("/v1/models", response_model=None, dependencies=guarded)
    async def models() -> BaseModel:
        return await handlers.models()

    @api.get("/v1/stats", response_model=None, dependencies=guarded)
    async def stats() -> BaseModel | JSONResponse:
        return await handlers.stats()

    @api.get("/openapi.json", response_model=None, dependencies=guarded)
    async def openapi() -> JSONResponse:
        return JSONResponse(api.openapi())

    @api.get("/docs", response_model=None, dependencies=guarded)
    async def docs(request: Request) -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=f"{request.scope.get('root_path', '')}/openapi.json", title="presto-ray")

    @api.get("/redoc", response_model=None, dependencies=guarded)
    async def redoc(request: Request) -> HTMLResponse:
        return get_redoc_html(openapi_url=f"{request.scope.get('root_path', '')}/openapi.json", title="presto-ray")

    @api.post("/v1/completions", response_model=None, dependencies=guarded, **openapi_route(chat=False))
    async def completions(request: Request) -> BaseModel | Response:
        return await handlers.completion(request, chat=False)

    @api.post("/v1/chat/completions", response_model=None, dependencies=guarded, **openapi_route(chat=True))
    async def chat_completions(request: Request) -> BaseModel | Response:
        return await handlers.completion(request, chat=True)

    return api
