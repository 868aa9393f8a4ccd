"""The HTTP ingress: one Serve replica's work for each request (serve_app.py makes it a deployment).

It gets the sampling pool's coordinator handles once and runs each request's `n` chains as
coroutines, their requests going straight to the coordinators. Every ingress replica shares the
one pool, so the calls of all concurrent requests merge, however many ingress replicas Serve runs.

This is the transport only: the body read bounded in size and time (body_reader.py), running the
chains and streaming their events, and clients that leave (client_disconnects.py). What a body
may say and what the service answers (fields, prompts, seeds, every response body) is the
library's presto_ray/openai/ package; the routes, the bearer token and the guard in front of them
are ingress_api.py's; the /v1/stats body is built by serve_stats.py.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle

from actors.chain_driver import drive_chain
from actors.coordinator import CoordinatorHandle
from actors.coordinator_shards import CoordinatorShards
from deployments.body_reader import read_body
from deployments.client_disconnects import DisconnectReports, client_left
from deployments.error_response import error_response, service_error
from deployments.ingress_api import build_api
from deployments.replica_logging import log_to_stderr
from deployments.serve_stats import stats_response
from presto_ray.chain import Chain
from presto_ray.engines import build_tokenizer
from presto_ray.job import JobConfig
from presto_ray.openai import (
    ApiError,
    Prepared,
    SampledChoice,
    check_content_encoding,
    check_content_type,
    check_transfer_encoding,
    choice_from_result,
    completion_response,
    done_chunk,
    models_body,
    prepare,
    progress_chunk,
    sse_event,
    stream_end,
)
from presto_ray.results import SampleResult
from presto_ray.serve_config import API_KEY_ENV

ChainId = tuple[str, int]  # (request id, choice index)


def served_model_name(config: JobConfig) -> str:
    """The model id clients name and /v1/models lists."""
    return config.serve.model_name or config.engine.model_name


# how long a failed request waits for the pool to name its coordinators (service_error's 503 or 500)
POOL_ANSWER_TIMEOUT_S = 10.0


def _actor_ids(shards: CoordinatorShards) -> list[object]:
    return [getattr(handle, "_actor_id", id(handle)) for handle in shards.handles]


class PrestoIngress:
    """One ingress replica. `config`: the JobConfig as JSON (what Serve passes); `pool`: the
    SamplingPool deployment's handle."""

    def __init__(self, config: dict[str, Any], pool: DeploymentHandle) -> None:
        self.config = JobConfig.model_validate(config)
        self.settings = self.config.serve
        self.model_name = served_model_name(self.config)
        self.api_key = os.environ.get(API_KEY_ENV) or self.settings.api_key
        self.tokenizer = build_tokenizer(self.config.engine)
        self.context = self.config.engine.context_length
        self.pool = pool
        self.disconnects = DisconnectReports(pool)
        self._coordinators: CoordinatorShards | None = None

    def __serve_build_asgi_app__(self) -> FastAPI:
        """Serve's seam, called on the replica once __init__ is done: this replica's log on its
        stderr, and the application it serves."""
        log_to_stderr()
        return self.asgi_app(serve.get_replica_context().replica_id.unique_id)

    def asgi_app(self, replica_id: str) -> FastAPI:
        """The routes over this replica's handlers, tagged with `replica_id`."""
        return build_api(self, self.settings, self.api_key, replica_id)

    async def coordinators(self) -> CoordinatorShards:
        """The pool's coordinator handles, asked for once (again after the pool was restarted)."""
        if self._coordinators is None:
            self._coordinators = await self.pool.coordinators.remote()
        return self._coordinators

    # --- what the routes call ----------------------------------------------------------------
    async def models(self) -> BaseModel:
        return models_body(self.model_name)

    async def stats(self) -> BaseModel | JSONResponse:
        shards: CoordinatorShards | None = None
        try:
            shards = await self.coordinators()
            snapshot = await shards.snapshot()
            disconnects, pending = await asyncio.gather(self.pool.disconnects.remote(), self.pool.pending_replicas.remote())
            return stats_response(snapshot, client_disconnects=disconnects, pending_replicas=pending)
        except Exception as e:  # the coordinator is restarting: no internals in the answer
            return error_response(await self._failure(e, None, shards))

    async def completion(self, request: Request, chat: bool) -> BaseModel | Response:
        try:
            return await self._answer(request, chat)
        except asyncio.CancelledError:  # Serve cancels a request whose client went away
            if not getattr(request.state, "disconnect_reported", False):  # _answer's chains said it
                self.disconnects.report(None, "before its answer")
            raise
        except Exception as e:  # a bug or a dead engine, never the client's input: no internals in the body
            if client_left(e):  # the client left; its calls were cancelled on the way out
                self.disconnects.report(None, "before its answer")
                raise asyncio.CancelledError from None
            return error_response(await self._failure(e, None, None))

    # --- one request -------------------------------------------------------------------------
    async def _failure(self, error: BaseException, request_id: str | None, used: CoordinatorShards | None) -> ApiError:
        """What a failed request is answered (service_error). `used`: the coordinators the request
        was given (None: it failed before it had any). Whether their pool was replaced is read off
        the coordinators the pool names now: new ones, or none answering within
        POOL_ANSWER_TIMEOUT_S (Serve is starting the pool again), and a retry reaches the new pool;
        the same ones, and a coordinator died for good while its pool lives. Each request compares
        its own coordinators, so many requests failing at once all get the same answer."""
        if not isinstance(error, RayActorError):
            return service_error(error, request_id)
        if self._coordinators is used:  # the first to fail asks the pool again; the rest reuse its answer
            self._coordinators = None
        replaced = False
        try:
            fresh = await asyncio.wait_for(self.coordinators(), POOL_ANSWER_TIMEOUT_S)
            replaced = used is not None and _actor_ids(fresh) != _actor_ids(used)
        except Exception:
            replaced = True
        return service_error(error, request_id, pool_replaced=replaced)

    async def _answer(self, request: Request, chat: bool) -> BaseModel | Response:
        try:
            check_content_type(request.headers.get("content-type"))
            check_content_encoding(request.headers.getlist("content-encoding"))
            check_transfer_encoding(request.headers.getlist("transfer-encoding"))
            prepared = prepare(
                await read_body(request, self.settings.max_body_bytes, self.settings.request_read_timeout_s),
                chat,
                tokenizer=self.tokenizer,
                model_name=self.model_name,
                context_length=self.context,
                base_sampler=self.config.sampler,
                settings=self.settings,
            )
        except ApiError as e:
            return error_response(e)
        shards = await self.coordinators()
        coordinator: CoordinatorHandle = shards.for_prompt(prepared.prompt_ids)
        chains = [Chain(prepared.prompt_ids, config, self.tokenizer.eos_token_id) for config in prepared.configs]
        # not pre-registered with the coordinator (as batch jobs do): a request cancelled before its
        # chains start would leave them holding rounds back until chain_idle_timeout_s; the n
        # chains' first plans arrive together anyway
        ids = [(prepared.id, i) for i in range(len(chains))]
        if prepared.stream:
            return StreamingResponse(self._stream(shards, prepared, chains, ids), media_type="text/event-stream")
        tasks = [asyncio.create_task(drive_chain(coordinator, cid, c)) for cid, c in zip(ids, chains)]
        try:
            results = await asyncio.gather(*tasks)
        except BaseException as e:
            if not isinstance(e, asyncio.CancelledError):  # (cancelled, gather has cancelled each once)
                for task in tasks:
                    task.cancel()  # one chain failed or Ray cancelled its call: the others stop too
            if isinstance(e, asyncio.CancelledError) or client_left(e):
                request.state.disconnect_reported = True
                self.disconnects.report(prepared.id, "before its answer", coordinator, ids, tasks)
                raise asyncio.CancelledError from None
            if not isinstance(e, Exception):
                raise
            # an engine failure: this request fails, the service keeps serving
            return error_response(await self._failure(e, prepared.id, shards))
        return completion_response(prepared, [self._choice(prepared, i, r) for i, r in enumerate(results)])

    async def _stream(self, shards: CoordinatorShards, prepared: Prepared, chains: list[Chain], ids: list[ChainId]) -> AsyncIterator[str]:
        """Server-sent events: a progress chunk per round per chain, then each choice's text.
        `shards`: the pool's coordinators when the request came (the prompt's shard runs it)."""
        coordinator = shards.for_prompt(prepared.prompt_ids)
        events: asyncio.Queue[BaseModel | SampledChoice | None] = asyncio.Queue()
        left = list[int]()  # chains that saw their client leave

        async def run(i: int) -> None:
            async def progress(chain: Chain) -> None:
                await events.put(progress_chunk(prepared, i, chain.stats, chain.event_index, chain.schedule.num_events))

            try:
                result = await drive_chain(coordinator, ids[i], chains[i], on_round=progress)
                await events.put(self._choice(prepared, i, result))
            except Exception as e:
                if client_left(e):  # the stream was closed: its client left, nobody reads this event
                    left.append(i)
                    return
                await events.put((await self._failure(e, prepared.id, shards)).response())
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
                self.disconnects.report(prepared.id, "during its stream", coordinator, ids, tasks)

    def _choice(self, prepared: Prepared, index: int, result: SampleResult) -> SampledChoice:
        return choice_from_result(index, result, prepared.configs[index].seed, self.tokenizer, prepared.logprobs)
