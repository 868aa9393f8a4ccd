"""The Ray Serve application: an OpenAI-compatible HTTP ingress over the coordinator.

    presto-ray serve --config configs/local.yaml          # http://127.0.0.1:8000/v1
    serve run deployments/serve_config.yaml               # the same application, Serve's way

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, and
GET /v1/stats (the coordinator's counters). Each request runs `n` chains as coroutines in the
ingress; their requests go to the one coordinator (shared by every concurrent request, so their
calls merge) and from there to the engine replicas. Request parsing and validation live in
presto_ray/openai_api.py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import uuid
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve

from actors.chain_actor import drive_chain
from actors.coordinator import start_coordinator
from actors.engine_replica import start_replicas
from presto_ray.chain import Chain
from presto_ray.job import JobConfig, ToyEngineSpec, build_tokenizer
from presto_ray.keys import derive_seed
from presto_ray.openai_api import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    check_prompt,
    choice_stats,
    chunk_body,
    completion_body,
    parse_request,
    sampler_config,
)
from presto_ray.serve_config import API_KEY_ENV

api = FastAPI(title="presto-ray", description="Exact power sampling, OpenAI-compatible.")


def _model_name(config: JobConfig) -> str:
    if config.serve.model_name:
        return config.serve.model_name
    if isinstance(config.engine, ToyEngineSpec):
        return "toy"
    return Path(config.engine.model).name if config.engine.model else "SmolLM2-135M-Instruct"


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1024)
@serve.ingress(api)
class PrestoIngress:
    def __init__(self, config: dict) -> None:
        self.config = JobConfig.model_validate(config)
        self.settings = self.config.serve
        self.model_name = _model_name(self.config)
        self.api_key = os.environ.get(API_KEY_ENV) or self.settings.api_key
        self.tokenizer = build_tokenizer(self.config.engine)
        engine = self.config.engine
        self.context = self.settings.max_context_tokens if isinstance(engine, ToyEngineSpec) else engine.max_model_len
        self.replicas = start_replicas(engine, self.config.ray)
        self.coordinator = start_coordinator(self.replicas, self.config.ray)
        self._requests = itertools.count()

    # --- routes --------------------------------------------------------------------------
    @api.get("/health")
    async def health(self) -> dict:
        return {"status": "ok"}

    @api.get("/v1/models")
    async def models(self, request: Request):
        if denied := self._denied(request):
            return denied
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0, "owned_by": "presto-ray"}]}

    @api.get("/v1/stats")
    async def stats(self, request: Request):
        if denied := self._denied(request):
            return denied
        return await self.coordinator.get_stats.remote()

    @api.post("/v1/completions")
    async def completions(self, request: Request):
        return await self._handle(request, chat=False)

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        return await self._handle(request, chat=True)

    # --- one request ---------------------------------------------------------------------
    async def _handle(self, request: Request, chat: bool):
        try:
            self._authorize(request)
            body = parse_request(await self._read(request), ChatRequest if chat else CompletionRequest, self.settings.max_body_bytes)
            if body.model is not None and body.model != self.model_name:
                raise ApiError(404, f"the model {body.model!r} does not exist; this service serves {self.model_name!r}", "model", "not_found_error")
            config = sampler_config(body, self.config.sampler, self.settings)
            prompt = self._prompt_ids(body, chat)
            check_prompt(prompt, config.block_size * config.num_blocks, self.context, getattr(self.tokenizer, "vocab_size", None))
        except ApiError as e:
            return JSONResponse(e.body(), e.status)
        seed = body.seed if body.seed is not None else random.randrange(2**31)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        chains = [Chain(prompt, config.model_copy(update={"seed": derive_seed(seed, i)}), self.tokenizer.eos_token_id) for i in range(body.n)]
        # not pre-registered with the coordinator (as batch jobs do): a request cancelled before its
        # chains start would leave them registered for good; the n chains' first plans arrive together
        ids = [(rid, i) for i in range(body.n)]
        if body.stream:
            events = self._stream(rid, chat, chains, ids, seed, len(prompt))
            return StreamingResponse(events, media_type="text/event-stream")
        try:
            results = await asyncio.gather(*(drive_chain(self.coordinator, cid, c) for cid, c in zip(ids, chains)))
        except Exception as e:  # an engine failure: this request fails, the service keeps serving
            return JSONResponse(ApiError(500, f"sampling failed: {e}", None, "server_error").body(), 500)
        choices = [self._choice(i, r, derive_seed(seed, i)) for i, r in enumerate(results)]
        return completion_body(rid, self.model_name, chat, choices, len(prompt), seed)

    async def _stream(self, rid, chat, chains, ids, seed, prompt_tokens):
        """Server-sent events: a progress chunk per round per chain, then each choice's text."""
        events: asyncio.Queue = asyncio.Queue()
        total = [c.schedule.num_events for c in chains]

        async def run(i: int):
            async def progress(chain: Chain) -> None:
                extra = {"event": "progress", "transitions": chain.stats.transitions, "model_calls": chain.stats.rounds,
                         "events_done": chain.event_index, "events_total": total[i]}  # fmt: skip
                await events.put(chunk_body(rid, self.model_name, chat, i, None, None, extra))

            try:
                result = await drive_chain(self.coordinator, ids[i], chains[i], on_round=progress)
                choice = self._choice(i, result, derive_seed(seed, i))
                extra = {"event": "done", **choice["power_sampling"], "completion_tokens": choice["completion_tokens"]}
                await events.put(chunk_body(rid, self.model_name, chat, i, choice["text"], choice["finish_reason"], extra))
            except Exception as e:
                await events.put({"error": ApiError(500, f"sampling failed: {e}", None, "server_error").body()["error"]})
            finally:
                await events.put(None)  # this chain is over

        tasks = [asyncio.create_task(run(i)) for i in range(len(chains))]
        try:
            over = 0
            while over < len(tasks):
                event = await events.get()
                if event is None:
                    over += 1
                else:
                    yield f"data: {json.dumps(event)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            for task in tasks:
                task.cancel()  # the client went away: stop its chains

    # --- helpers -------------------------------------------------------------------------
    def _denied(self, request: Request) -> JSONResponse | None:
        try:
            self._authorize(request)
        except ApiError as e:
            return JSONResponse(e.body(), e.status)
        return None

    def _authorize(self, request: Request) -> None:
        if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
            raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", None, "invalid_api_key")

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

    def _prompt_ids(self, body, chat: bool) -> list[int]:
        if chat:
            return list(self.tokenizer.apply_chat_template([m.model_dump() for m in body.messages]))
        prompt = body.prompt
        if isinstance(prompt, str):
            return self.tokenizer.encode_raw(prompt) if prompt else []
        if prompt and all(isinstance(p, str) for p in prompt):
            if len(prompt) != 1:
                raise ApiError(400, "one prompt per request (use n for several samples of it)", "prompt")
            return self.tokenizer.encode_raw(prompt[0]) if prompt[0] else []
        return list(prompt)

    def _choice(self, index: int, result, seed: int) -> dict:
        tokens = result.token_ids
        ended = bool(tokens) and tokens[-1] == self.tokenizer.eos_token_id
        return {
            "index": index,
            "text": self.tokenizer.decode(tokens),
            "finish_reason": "stop" if ended else "length",
            "completion_tokens": len(tokens),
            "power_sampling": choice_stats(result.stats, seed),
        }


def build_app(args: dict | None = None):
    """Serve's application builder. `args`: {"config": YAML path} plus optional `serve:` fields
    (e.g. "api_key"), as `serve run` / serveConfigV2 pass them."""
    args = dict(args or {})
    path = args.pop("config", None)
    config = JobConfig.from_yaml(path) if path else JobConfig()
    if args:
        config = JobConfig.model_validate({**config.model_dump(), "serve": {**config.serve.model_dump(), **args}})
    return app_for(config)


def app_for(config: JobConfig):
    return PrestoIngress.bind(config.model_dump(mode="json"))


def start_service(config: JobConfig, address: str | None = None, name: str = "presto") -> str:
    """Deploy the application on Ray Serve (local Ray unless `address`); returns its base URL."""
    from deployments.batch_job import ensure_ray

    ensure_ray(address)
    settings = config.serve
    serve.start(http_options={"host": settings.host, "port": settings.port})
    serve.run(app_for(config), name=name, route_prefix="/")
    return f"http://{settings.host}:{settings.port}"


def run_service(config: JobConfig, address: str | None = None) -> None:
    """`presto-ray serve`: deploy, print where, block until Ctrl-C."""
    import time

    url = start_service(config, address)
    print(f"presto-ray serving {_model_name(config)} at {url}/v1 (Ctrl-C stops)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
