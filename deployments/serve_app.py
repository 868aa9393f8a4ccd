"""The Ray Serve application: an OpenAI-compatible HTTP ingress over the coordinator.

    presto-ray serve --config configs/local.yaml          # http://127.0.0.1:8000/v1
    serve run deployments/serve_config.yaml               # the same application, Serve's way

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,
GET /v1/stats (the coordinator's counters), and the API docs (GET /docs, /redoc, /openapi.json;
behind the bearer token like every route but /health).

Two deployments: `SamplingPool` (one replica) owns the engine replicas and the coordinator shards
(actors/cluster.py); `PrestoIngress` (HTTP, `serve.ingress_replicas` or Serve autoscaling) gets the
pool's coordinator handles once and runs each request's `n` chains as coroutines, their requests
going straight to the coordinators. Every ingress replica shares the one pool, so the calls of
all concurrent requests merge, however many ingress replicas Serve runs. The engine replicas are
Ray actors the pool owns rather than Serve replicas because the coordinator addresses each one
(prefix affinity, per-replica event streams, failover), which a Serve handle's routing hides;
they die with the pool.

This module is the transport only: the bearer token, bounded headers (431) and a body read
bounded in size (413) and time (408), routing errors in OpenAI's shape, the proxy middleware that
drops unsafe client request ids, running the chains and streaming their events, and clients that
leave (one log line and a count, never an error with a traceback). What a body may say and what the service answers (fields, prompts,
seeds, every response body) is the library's presto_ray/openai/ package; the /v1/stats body is
built from the coordinator's snapshot by deployments/serve_stats.py.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import ray
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from ray import serve
from ray.exceptions import RayActorError, TaskCancelledError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from actors.chain_actor import drive_chain
from actors.cluster import SamplingCluster, ensure_ray
from actors.coordinator_shards import CoordinatorShards
from deployments.serve_stats import stats_response
from presto_ray.chain import Chain
from presto_ray.engines import build_tokenizer
from presto_ray.job import JobConfig
from presto_ray.openai import (
    ApiError,
    Prepared,
    SampledChoice,
    check_api_key,
    check_content_type,
    check_headers,
    choice_from_result,
    client_disconnected,
    completion_response,
    done_chunk,
    error_event,
    http_error,
    internal_error,
    models_body,
    openapi_route,
    prepare,
    progress_chunk,
    sse_event,
    safe_request_id,
    stream_end,
)
from presto_ray.results import SampleResult
from presto_ray.serve_config import API_KEY_ENV, ServeConfig

# Serve's HTTP proxy calls this (module:function) for Starlette middlewares of its own, which run
# before Serve's request-id middleware: start_service sets it for the local Ray it starts
PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
PROXY_CALLBACK = "deployments.serve_app:proxy_middlewares"
REQUEST_ID_HEADER = b"x-request-id"
# after a client left: how long the ingress waits for its chains' tasks to end before saying
# chain_finished for them again (they end at their next await; this bounds a stuck one)
DISCONNECT_SETTLE_S = 10.0

# FastAPI's own docs routes cannot see the API key: the ingress serves them itself, behind it
api = FastAPI(
    title="presto-ray",
    description="Exact power sampling, OpenAI-compatible.",
    docs_url=None,
    redoc_url=None,
    openapi_url=None,
    # no 307 to a Location built from the client's Host header: /v1/completions/ is a 404
    redirect_slashes=False,
)


def _model_name(config: JobConfig) -> str:
    return config.serve.model_name or config.engine.model_name


# above the deployment: Serve pickles the class by value when it is decorated, with the
# module-level names that exist at that point
def _error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), error.status, headers=error.headers)


class IngressGuard:
    """Every route, as plain ASGI (no BaseHTTPMiddleware: no task group and memory streams per
    request): bounded headers (431) and no second Authorization, Content-Type or Content-Length
    (400), since uvicorn in Serve's proxy bounds neither the size nor the count of headers; the
    replica that answered in x-presto-ingress-replica (operators, and the test that two replicas
    share a pool); and a receive channel that Ray cancelled (the client left, so Serve cancels
    the request and every call it made, its receive call included) read as the disconnect it
    is, not raised as TaskCancelledError out of Starlette's disconnect listener."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        replica = serve.get_replica_context().replica_id.unique_id.encode()

        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (b"x-presto-ingress-replica", replica)]}
            await send(message)

        settings = getattr(scope["app"].state, "serve_settings", None) or ServeConfig()
        try:
            check_headers(scope["headers"], settings.max_headers, settings.max_header_bytes)
        except ApiError as e:
            await _error_response(e)(scope, receive, tagged)
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


api.add_middleware(IngressGuard)


@api.exception_handler(StarletteHTTPException)
async def _http_exception(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Starlette's own answers (404 unknown route, 405 wrong method) in OpenAI's error shape."""
    return _error_response(http_error(exc.status_code, str(exc.detail), dict(exc.headers or {})))


class SafeRequestId:
    """In Serve's proxy, before its request-id middleware: a client's X-Request-Id is kept only
    when it matches [A-Za-z0-9._-]{1,64}; otherwise it is dropped and Serve generates one, so
    no client-chosen text reaches the logs or is echoed back."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            headers = scope["headers"]
            values = [v for k, v in headers if k.lower() == REQUEST_ID_HEADER]
            if values and (len(values) > 1 or safe_request_id(values[0].decode("latin-1")) is None):
                scope = {**scope, "headers": [(k, v) for k, v in headers if k.lower() != REQUEST_ID_HEADER]}
        await self.app(scope, receive, send)


def proxy_middlewares() -> list[Any]:
    """What Serve's HTTP proxy calls through RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH, in the
    proxy's process before its uvicorn server starts: the request-id middleware, and a bound
    on the time to send a request's headers (`bound_header_reads`)."""
    from starlette.middleware import Middleware

    bound_header_reads(float(os.environ.get(HEADER_TIMEOUT_ENV) or DEFAULT_HEADER_TIMEOUT_S))
    return [Middleware(SafeRequestId)]


# uvicorn in Serve's proxy sets no timer while a request's headers arrive (its keep-alive timer
# runs only between a response and the next request's first byte, and none on a new connection),
# so a client that opens a connection and sends nothing, or part of its headers, holds it for as
# long as it likes. Serve passes uvicorn no protocol of its own ("auto"), so the proxy's process
# can name this one instead.
HEADER_TIMEOUT_ENV = "PRESTO_RAY_HEADER_TIMEOUT_S"
DEFAULT_HEADER_TIMEOUT_S = 10.0
BoundedHeadersProtocol: Any = None  # built by bound_header_reads (uvicorn imports it by name)


def bound_header_reads(timeout_s: float) -> None:
    """In this process, uvicorn's default HTTP protocol becomes one that answers 408 and closes a
    connection whose request headers have not all arrived `timeout_s` seconds after it opened
    (or after the first byte of a next request on a kept-alive connection)."""
    global BoundedHeadersProtocol
    import uvicorn.config
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    BoundedHeadersProtocol = bounded_headers_protocol(AutoHTTPProtocol, timeout_s)
    uvicorn.config.HTTP_PROTOCOLS["auto"] = f"{__name__}:BoundedHeadersProtocol"


def bounded_headers_protocol(base: type[Any], timeout_s: float) -> type[Any]:
    """`base` (uvicorn's httptools or h11 protocol) with a deadline for each request's headers.
    A request is under way from its headers' end (uvicorn's `cycle`) until its response is
    complete; the body's time is the ingress's (serve.request_read_timeout_s, a 408)."""
    body = json.dumps(ApiError(408, f"the request headers did not arrive within {timeout_s:g} s", None, "timeout_error").body())
    answer = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        f"content-length: {len(body)}\r\n\r\n{body}"
    ).encode()

    class BoundedHeaders(base):
        _header_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._header_deadline is None and not self._in_request():
                self._arm()  # the first bytes of a next request on a kept-alive connection
            super().data_received(data)
            if self._in_request():
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _in_request(self) -> bool:
            cycle = getattr(self, "cycle", None)
            return cycle is not None and not cycle.response_complete

        def _arm(self) -> None:
            self._disarm()
            self._header_deadline = self.loop.call_later(timeout_s, self._headers_late)

        def _disarm(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
                self._header_deadline = None

        def _headers_late(self) -> None:
            self._header_deadline = None
            if self._in_request() or self.transport.is_closing():
                return
            self.transport.write(answer)
            self.transport.close()

    BoundedHeaders.__name__ = BoundedHeaders.__qualname__ = f"BoundedHeaders{base.__name__}"
    return BoundedHeaders


def _log_to_stderr() -> None:
    """The library's service log (presto_ray.serve: error ids, disconnects) on the replica's
    stderr, INFO and up (Python's last-resort handler would print warnings only)."""
    logger = logging.getLogger("presto_ray.serve")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s presto_ray.serve -- %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def _client_left(error: BaseException | None = None) -> bool:
    """Whether the running task is being cancelled (its client left), or `error` is Ray's word
    for the same: Serve cancels a request whose client went away and Ray cancels every call the
    request made, so an awaited coordinator call raises TaskCancelledError, maybe before the
    task's own cancellation arrives (nothing else cancels those calls), and a body being read
    ends in ClientDisconnect."""
    task = asyncio.current_task()
    return isinstance(error, TaskCancelledError | ClientDisconnect) or (task is not None and task.cancelling() > 0)


def _outside_the_request() -> contextvars.Context:
    """A copy of this context without Ray's record of the request being served (the context
    variable Ray's recursive cancellation follows). Calls made in it outlive the request's
    cancellation: a chain's `chain_finished` that was in flight when its client left is
    cancelled with the request, so the coordinator never heard that the chain ended and
    expired it after chain_idle_timeout_s; the ingress says it again from here."""
    context = contextvars.copy_context()
    current_task_id = getattr(getattr(ray, "_raylet", None), "async_task_id", None)
    if current_task_id is not None:
        context.run(current_task_id.set, None)
    return context


@serve.deployment(ray_actor_options={"num_cpus": 0}, num_replicas=1)
class SamplingPool:
    """The engine replicas and coordinator shards of one application (one replica; Ray restarts
    what dies inside it, and the actors it owns die with it)."""

    def __init__(self, config: dict[str, Any]) -> None:
        job = JobConfig.model_validate(config)
        self.cluster = SamplingCluster(job.engine, job.ray).start()
        self.client_disconnects = 0  # every ingress replica reports here: /v1/stats is service-wide

    def count_disconnect(self) -> None:
        self.client_disconnects += 1

    def disconnects(self) -> int:
        return self.client_disconnects

    def coordinators(self) -> CoordinatorShards:
        shards = self.cluster.coordinators
        if shards is None:  # start() sets them; None only once shut down
            raise RuntimeError("the sampling pool is shut down")
        return shards

    def __del__(self) -> None:  # Serve calls it when the application goes: free the engines
        try:
            self.cluster.shutdown()
        except Exception:  # already half gone: nothing more to free
            pass


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1024)
@serve.ingress(api)
class PrestoIngress:
    def __init__(self, config: dict[str, Any], pool: Any) -> None:  # pool: SamplingPool's DeploymentHandle
        self.config = JobConfig.model_validate(config)
        self.settings = self.config.serve
        self.model_name = _model_name(self.config)
        self.api_key = os.environ.get(API_KEY_ENV) or self.settings.api_key
        self.tokenizer = build_tokenizer(self.config.engine)
        engine = self.config.engine
        self.context = engine.context_length
        self.pool = pool  # a handle to SamplingPool
        self._coordinators: CoordinatorShards | None = None
        self._reports: set[asyncio.Task[None]] = set()  # disconnects on their way to the pool
        api.state.serve_settings = self.settings  # the header bounds' middleware reads them
        _log_to_stderr()

    async def coordinators(self) -> CoordinatorShards:
        """The pool's coordinator handles, asked for once (again after the pool was restarted)."""
        if self._coordinators is None:
            self._coordinators = await self.pool.coordinators.remote()
        return self._coordinators

    # --- routes --------------------------------------------------------------------------
    # response_model=None: FastAPI would read the return annotations as response models (the
    # bodies are built and validated by the library; the POST routes' schema is openapi_route's).
    # /health keeps its annotation as its documented response, as before.
    @api.get("/health")
    async def health(self) -> dict[str, Any]:
        return {"status": "ok"}

    @api.get("/v1/models", response_model=None)
    async def models(self, request: Request) -> BaseModel | JSONResponse:
        if denied := self._denied(request):
            return denied
        return models_body(self.model_name)

    @api.get("/v1/stats", response_model=None)
    async def stats(self, request: Request) -> BaseModel | JSONResponse:
        if denied := self._denied(request):
            return denied
        try:
            snapshot = await (await self.coordinators()).snapshot()
            return stats_response(snapshot, client_disconnects=await self.pool.disconnects.remote())
        except Exception as e:  # the coordinator is restarting: no internals in the answer
            self._forget_dead_pool(e)
            return _error_response(internal_error(e))

    @api.get("/openapi.json", response_model=None)
    async def openapi(self, request: Request) -> JSONResponse:
        if denied := self._denied(request):
            return denied
        return JSONResponse(api.openapi())

    @api.get("/docs", response_model=None)
    async def docs(self, request: Request) -> HTMLResponse | JSONResponse:
        if denied := self._denied(request):
            return denied
        return get_swagger_ui_html(openapi_url=f"{request.scope.get('root_path', '')}/openapi.json", title="presto-ray")

    @api.get("/redoc", response_model=None)
    async def redoc(self, request: Request) -> HTMLResponse | JSONResponse:
        if denied := self._denied(request):
            return denied
        return get_redoc_html(openapi_url=f"{request.scope.get('root_path', '')}/openapi.json", title="presto-ray")

    @api.post("/v1/completions", response_model=None, **openapi_route(chat=False))
    async def completions(self, request: Request) -> BaseModel | Response:
        return await self._handle(request, chat=False)

    @api.post("/v1/chat/completions", response_model=None, **openapi_route(chat=True))
    async def chat_completions(self, request: Request) -> BaseModel | Response:
        return await self._handle(request, chat=True)

    # --- one request ---------------------------------------------------------------------
    async def _handle(self, request: Request, chat: bool) -> BaseModel | Response:
        try:
            return await self._answer(request, chat)
        except asyncio.CancelledError:  # Serve cancels a request whose client went away
            if not getattr(request.state, "disconnect_reported", False):  # _answer's chains said it
                self._disconnected(None, "before its answer")
            raise
        except Exception as e:  # a bug or a dead engine, never the client's input: no internals in the body
            if _client_left(e):  # the client left; its calls were cancelled on the way out
                self._disconnected(None, "before its answer")
                raise asyncio.CancelledError from None
            self._forget_dead_pool(e)
            return _error_response(internal_error(e))

    def _disconnected(
        self, request_id: str | None, where: str, coordinator: Any = None, chain_ids: list[tuple[str, int]] | None = None,
        chains: list[asyncio.Task[Any]] | None = None,
    ) -> None:  # fmt: skip
        """A client left: one log line, counted in the pool (so /v1/stats sums every replica's),
        and, once its chains' tasks are over, `chain_finished` again for each of its chains
        (`coordinator`), outside the request, where Ray's cancellation of the request cannot
        reach it (the coordinator takes a second word for a chain as nothing)."""
        client_disconnected(request_id, where)
        after = self._after_disconnect(coordinator, chain_ids or [], chains or [])
        task = asyncio.get_running_loop().create_task(after, context=_outside_the_request())
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    async def _after_disconnect(self, coordinator: Any, chain_ids: list[tuple[str, int]], chains: list[asyncio.Task[Any]]) -> None:
        if chains:  # each was cancelled: its own chain_finished goes out first (maybe to be cancelled)
            await asyncio.wait(chains, timeout=DISCONNECT_SETTLE_S)
        try:
            await asyncio.gather(*(coordinator.chain_finished.remote(cid) for cid in chain_ids))
        except Exception:  # a restarting coordinator has forgotten the chains anyway
            pass
        try:
            await self.pool.count_disconnect.remote()
        except Exception:  # the pool is restarting: the count is lost with it, nothing else
            pass

    def _forget_dead_pool(self, error: BaseException) -> None:
        if isinstance(error, RayActorError):  # the pool may have been restarted with new actors
            self._coordinators = None

    async def _answer(self, request: Request, chat: bool) -> BaseModel | Response:
        try:
            self._authorize(request)
            check_content_type(request.headers.get("content-type"))
            prepared = prepare(
                await self._read(request),
                chat,
                tokenizer=self.tokenizer,
                model_name=self.model_name,
                context_length=self.context,
                base_sampler=self.config.sampler,
                settings=self.settings,
            )
        except ApiError as e:
            return _error_response(e)
        coordinator = (await self.coordinators()).for_prompt(prepared.prompt_ids)
        chains = [Chain(prepared.prompt_ids, config, self.tokenizer.eos_token_id) for config in prepared.configs]
        # not pre-registered with the coordinator (as batch jobs do): a request cancelled before its
        # chains start would leave them holding rounds back until chain_idle_timeout_s; the n
        # chains' first plans arrive together anyway
        ids = [(prepared.id, i) for i in range(len(chains))]
        if prepared.stream:
            return StreamingResponse(self._stream(coordinator, prepared, chains, ids), media_type="text/event-stream")
        tasks = [asyncio.create_task(drive_chain(coordinator, cid, c)) for cid, c in zip(ids, chains)]
        try:
            results = await asyncio.gather(*tasks)
        except BaseException as e:
            if not isinstance(e, asyncio.CancelledError):  # (cancelled, gather has cancelled each once)
                for task in tasks:
                    task.cancel()  # one chain failed or Ray cancelled its call: the others stop too
            if isinstance(e, asyncio.CancelledError) or _client_left(e):
                request.state.disconnect_reported = True
                self._disconnected(prepared.id, "before its answer", coordinator, ids, tasks)
                raise asyncio.CancelledError from None
            if not isinstance(e, Exception):
                raise
            # an engine failure: this request fails, the service keeps serving
            self._forget_dead_pool(e)
            return _error_response(internal_error(e, prepared.id))
        return completion_response(prepared, [self._choice(prepared, i, r) for i, r in enumerate(results)])

    async def _stream(
        self, coordinator: Any, prepared: Prepared, chains: list[Chain], ids: list[tuple[str, int]]
    ) -> AsyncIterator[str]:
        """Server-sent events: a progress chunk per round per chain, then each choice's text.
        `coordinator`: the prompt's coordinator shard (an actor handle)."""
        events: asyncio.Queue[BaseModel | SampledChoice | None] = asyncio.Queue()
        left = list[int]()  # chains that saw their client leave

        async def run(i: int) -> None:
            async def progress(chain: Chain) -> None:
                await events.put(progress_chunk(prepared, i, chain.stats, chain.event_index, chain.schedule.num_events))

            try:
                result = await drive_chain(coordinator, ids[i], chains[i], on_round=progress)
                await events.put(self._choice(prepared, i, result))
            except Exception as e:
                if _client_left(e):  # the stream was closed: its client left, nobody reads this event
                    left.append(i)
                    return
                await events.put(error_event(e, prepared.id))
            finally:
                await events.put(None)  # this chain is over

        tasks = [asyncio.create_task(run(i)) for i in range(len(chains))]
        ended = False
        try:
            over, finished = 0, list[SampledChoice]()
            while over < len(tasks):
                event = await events.get()
                if left:  # Ray cancelled a chain's call before the stream's own cancellation came
                    return
                if event is None:
                    over += 1
                else:
                    if isinstance(event, SampledChoice):  # a chain is over: its text (and its cost, for usage)
                        finished.append(event)
                        event = done_chunk(prepared, event)
                    yield sse_event(prepared, event)
            for line in stream_end(prepared, finished):
                yield line
            ended = True
        finally:
            for task in tasks:
                task.cancel()  # the client went away: stop its chains
            if not ended:
                self._disconnected(prepared.id, "during its stream", coordinator, ids, tasks)

    def _choice(self, prepared: Prepared, index: int, result: SampleResult) -> SampledChoice:
        return choice_from_result(index, result, prepared.configs[index].seed, self.tokenizer, prepared.logprobs)

    # --- helpers -------------------------------------------------------------------------
    def _denied(self, request: Request) -> JSONResponse | None:
        try:
            self._authorize(request)
        except ApiError as e:
            return _error_response(e)
        return None

    def _authorize(self, request: Request) -> None:
        check_api_key(request.headers.get("authorization"), self.api_key)

    async def _read(self, request: Request) -> bytes:
        """The body, bounded in size (413) and in time: a body that does not arrive within
        serve.request_read_timeout_s (a stalled or trickling client) gets 408, and the connection
        is closed, so stalled clients do not hold the ingress."""
        limit, timeout = self.settings.max_body_bytes, self.settings.request_read_timeout_s
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"request body is {declared} bytes; the limit is {limit}")
        chunks, size = list[bytes](), 0
        try:
            async with asyncio.timeout(timeout):
                async for chunk in request.stream():
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > limit:
                        raise ApiError(413, f"request body is over the limit of {limit} bytes")
        except TimeoutError:
            message = f"the request body did not arrive within {timeout:g} s"
            raise ApiError(408, message, None, "timeout_error", {"Connection": "close"}) from None
        return b"".join(chunks)


def build_app(args: dict[str, Any] | None = None) -> Any:  # a bound Serve Application
    """Serve's application builder. `args`: {"config": YAML path} plus optional `serve:` fields
    (e.g. "api_key"), as `serve run` / serveConfigV2 pass them."""
    args = dict(args or {})
    path = args.pop("config", None)
    config = JobConfig.from_yaml(path) if path else JobConfig()
    if args:
        config = JobConfig.model_validate({**config.model_dump(), "serve": {**config.serve.model_dump(), **args}})
    return app_for(config)


def app_for(config: JobConfig) -> Any:  # a bound Serve Application
    """The application: the ingress (replicas or autoscaling from `serve:`) over one sampling pool."""
    as_json = config.model_dump(mode="json")
    ingress = PrestoIngress.options(**config.serve.ingress_deployment_options())
    return ingress.bind(as_json, SamplingPool.bind(as_json))


def start_service(config: JobConfig, address: str | None = None, name: str = "presto") -> str:
    """Deploy the application on Ray Serve (local Ray unless `address`); returns its base URL.
    The local Ray it starts runs Serve's proxy with `proxy_middlewares` (a cluster's own Ray
    needs RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH set where it starts, see docs/http.md)."""
    os.environ.setdefault(PROXY_CALLBACK_ENV, PROXY_CALLBACK)
    ensure_ray(address)
    settings = config.serve
    serve.start(http_options={"host": settings.host, "port": settings.port})
    serve.run(app_for(config), name=name, route_prefix="/")
    return f"http://{settings.host}:{settings.port}"


def run_service(config: JobConfig, address: str | None = None) -> None:
    """`presto-ray serve`: deploy, print where, block until Ctrl-C (or SIGTERM, as containers stop)."""
    import signal
    import time

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # explicit: a process started in the background of a non-interactive shell inherits SIGINT
    # ignored, and Ctrl-C (or a supervisor's SIGINT) would then never stop the service
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    url = start_service(config, address)
    print(f"presto-ray serving {_model_name(config)} at {url}/v1 (Ctrl-C stops)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        # a second signal (an impatient Ctrl-C, a supervisor repeating itself) must not break the
        # shutdown into a traceback
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("presto-ray: stopping the service", flush=True)
        serve.shutdown()

