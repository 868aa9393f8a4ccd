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

This module is the transport only: the bearer token, the bounded body read, running the chains
and streaming their events. What a body may say and what the service answers (fields, prompts,
seeds, every response body) is the library's presto_ray/openai/ package; the /v1/stats body is
built from the coordinator's snapshot by deployments/serve_stats.py.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from ray import serve
from ray.exceptions import RayActorError

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
    choice_from_result,
    completion_response,
    done_chunk,
    error_event,
    internal_error,
    models_body,
    openapi_route,
    prepare,
    progress_chunk,
    sse_event,
    stream_end,
)
from presto_ray.results import SampleResult
from presto_ray.serve_config import API_KEY_ENV

# FastAPI's own docs routes cannot see the API key: the ingress serves them itself, behind it
api = FastAPI(
    title="presto-ray",
    description="Exact power sampling, OpenAI-compatible.",
    docs_url=None,
    redoc_url=None,
    openapi_url=None,
)


def _model_name(config: JobConfig) -> str:
    return config.serve.model_name or config.engine.model_name


@api.middleware("http")
async def _tag_replica(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    """Say which ingress replica answered (operators, and the test that two replicas share a pool)."""
    response = await call_next(request)
    response.headers["x-presto-ingress-replica"] = serve.get_replica_context().replica_id.unique_id
    return response


# above the deployment: Serve pickles the class by value when it is decorated, with the
# module-level names that exist at that point
def _error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), error.status, headers=error.headers)


@serve.deployment(ray_actor_options={"num_cpus": 0}, num_replicas=1)
class SamplingPool:
    """The engine replicas and coordinator shards of one application (one replica; Ray restarts
    what dies inside it, and the actors it owns die with it)."""

    def __init__(self, config: dict[str, Any]) -> None:
        job = JobConfig.model_validate(config)
        self.cluster = SamplingCluster(job.engine, job.ray).start()

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
            return stats_response(await (await self.coordinators()).snapshot())
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
        except Exception as e:  # a bug or a dead engine, never the client's input: no internals in the body
            self._forget_dead_pool(e)
            return _error_response(internal_error(e))

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
        try:
            results = await asyncio.gather(*(drive_chain(coordinator, cid, c) for cid, c in zip(ids, chains)))
        except Exception as e:  # an engine failure: this request fails, the service keeps serving
            self._forget_dead_pool(e)
            return _error_response(internal_error(e, prepared.id))
        return completion_response(prepared, [self._choice(prepared, i, r) for i, r in enumerate(results)])

    async def _stream(
        self, coordinator: Any, prepared: Prepared, chains: list[Chain], ids: list[tuple[str, int]]
    ) -> AsyncIterator[str]:
        """Server-sent events: a progress chunk per round per chain, then each choice's text.
        `coordinator`: the prompt's coordinator shard (an actor handle)."""
        events: asyncio.Queue[BaseModel | SampledChoice | None] = asyncio.Queue()

        async def run(i: int) -> None:
            async def progress(chain: Chain) -> None:
                await events.put(progress_chunk(prepared, i, chain.stats, chain.event_index, chain.schedule.num_events))

            try:
                result = await drive_chain(coordinator, ids[i], chains[i], on_round=progress)
                await events.put(self._choice(prepared, i, result))
            except Exception as e:
                await events.put(error_event(e, prepared.id))
            finally:
                await events.put(None)  # this chain is over

        tasks = [asyncio.create_task(run(i)) for i in range(len(chains))]
        try:
            over, finished = 0, list[SampledChoice]()
            while over < len(tasks):
                event = await events.get()
                if event is None:
                    over += 1
                else:
                    if isinstance(event, SampledChoice):  # a chain is over: its text (and its cost, for usage)
                        finished.append(event)
                        event = done_chunk(prepared, event)
                    yield sse_event(prepared, event)
            for line in stream_end(prepared, finished):
                yield line
        finally:
            for task in tasks:
                task.cancel()  # the client went away: stop its chains

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
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"request body is {declared} bytes; the limit is {limit}")
        raw = b""
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limit:
                raise ApiError(413, f"request body is over the limit of {limit} bytes")
        return raw


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
    """Deploy the application on Ray Serve (local Ray unless `address`); returns its base URL."""
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
