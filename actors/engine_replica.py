"""An engine replica: one actor owning one engine (vLLM on a GPU, vLLM on the CPU, or the toy)."""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict
from collections.abc import Sequence

from ray.actor import ActorProxy

from actors.handles import remote_method
from actors.stream_protocol import ReplicaEvent, ReplicaEvents, ReplicaStart, StreamId
from presto_ray.early_rejection import RejectionBound
from presto_ray.engines import (
    CallAccounting,
    EngineEvent,
    EngineOutput,
    EngineConfig,
    ProposalRequest,
    StreamingEngine,
    build_engine,
)

# A coordinator that has neither polled nor submitted for this long is gone (killed or restarted
# under a new epoch): its streams are aborted and its undelivered events dropped.
STALE_COORDINATOR_S = 30.0


class EngineReplica:
    """Runs batched calls (rounds) and per-request streams (streaming) on its engine. Async, so that
    a slow call never blocks `ready` probes.

    vLLM calls overlap (its own scheduler batches them); the toy serves one call at a time, in a
    worker thread, like a device that runs one batch at once. Streams run on the engine's streaming
    form (`Engine.streaming()`), named by the coordinator's `StreamId`s; each coordinator long-polls
    `stream_events` for what happened to its own streams (ids carry the coordinator's epoch), so
    coordinators may share a replica.
    """

    def __init__(self, engine_spec: EngineConfig, replica_index: int) -> None:
        self.replica_index = replica_index
        self.engine = build_engine(engine_spec)
        self._stream_engine: StreamingEngine | None = None  # made on the first stream call
        self._handles: dict[StreamId, int] = {}
        self._stream_ids: dict[int, StreamId] = {}
        self._undelivered: dict[str, list[ReplicaEvent]] = defaultdict(list)  # by coordinator epoch
        self._last_seen: dict[str, float] = {}  # epoch -> when it last polled or submitted
        self._news = asyncio.Event()  # work submitted or events sorted: pollers look again
        self._advancing = False  # one poller advances the engine at a time; the others wait for news
        self._reported = CallAccounting()

    @remote_method
    def ready(self) -> dict[str, int | None]:
        return {"replica": self.replica_index, "pid": os.getpid(), "eos_token_id": self.engine.eos_token_id}

    @remote_method
    async def generate(self, requests: Sequence[ProposalRequest]) -> EngineOutput:
        return await self.engine.agenerate(requests)

    # --- streams ------------------------------------------------------------------------------
    @property
    def streams(self) -> StreamingEngine:
        if self._stream_engine is None:
            self._stream_engine = self.engine.streaming()
        return self._stream_engine

    @remote_method
    async def free_batch(self) -> float:
        """Sequences this replica runs before speculation stops paying (presto_ray/speculation.py)."""
        return float(self.streams.free_batch)

    @remote_method
    async def stream_submit(self, starts: Sequence[ReplicaStart]) -> None:
        engine = self.streams
        for start in starts:
            self._last_seen[start.stream_id[0]] = time.monotonic()
            try:
                handle = engine.submit(start.request, start.priority)
            except Exception as error:  # refused (e.g. over the context): the chain fails with the reason
                message = f"{type(error).__name__}: {error}"
                self._undelivered[start.stream_id[0]].append(ReplicaEvent(start.stream_id, 0, error=message))
                continue
            self._handles[start.stream_id], self._stream_ids[handle] = handle, start.stream_id
            for generated in start.wakes:
                engine.wake_at(handle, generated)
        self._news.set()

    @remote_method
    async def stream_wake(self, wakes: Sequence[tuple[StreamId, int]]) -> None:
        for stream_id, generated in wakes:
            handle = self._handles.get(stream_id)
            if handle is not None:
                self.streams.wake_at(handle, generated)

    @remote_method
    async def stream_bounds(self, bounds: Sequence[tuple[StreamId, tuple[RejectionBound, ...]]]) -> None:
        """New early-rejection bounds for running streams (a stream they stop ends as an event)."""
        for stream_id, new in bounds:
            handle = self._handles.get(stream_id)
            if handle is not None:
                self.streams.set_rejection_bounds(handle, new)
        self._news.set()

    @remote_method
    async def stream_abort(self, stream_ids: Sequence[StreamId]) -> None:
        for stream_id in stream_ids:
            handle = self._handles.pop(stream_id, None)
            if handle is not None:
                del self._stream_ids[handle]
                self.streams.abort(handle)

    @remote_method
    async def stream_events(self, epoch: str, timeout_s: float) -> ReplicaEvents:
        """What happened to coordinator `epoch`'s streams since its last poll: waits (at most
        `timeout_s`) for something."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self._last_seen[epoch] = time.monotonic()
        self._abort_stale_coordinators()
        engine = self.streams
        while not self._undelivered.get(epoch) and (remaining := deadline - loop.time()) > 0:
            if self._advancing or not engine.busy:
                self._news.clear()
                try:
                    await asyncio.wait_for(self._news.wait(), remaining)
                except asyncio.TimeoutError:
                    pass
                continue
            self._advancing = True
            try:
                self._sort(await engine.next_events(remaining))
            finally:
                self._advancing = False
                self._news.set()
        return ReplicaEvents(tuple(self._undelivered.pop(epoch, ())), self._accounting_since_last_poll())

    def _sort(self, events: Sequence[EngineEvent]) -> None:
        """File the engine's events under their coordinators; ended streams are forgotten."""
        engine = self.streams
        for event in events:
            stream_id = self._stream_ids.get(event.handle)
            if stream_id is None:
                continue
            ended = event.ended
            if ended:
                del self._stream_ids[event.handle], self._handles[stream_id]
            error = event.reason
            partial = None if ended else tuple(engine.partial_tokens(event.handle))
            self._undelivered[stream_id[0]].append(ReplicaEvent(stream_id, event.generated, partial, event.completion, error))

    def _abort_stale_coordinators(self) -> None:
        now = time.monotonic()
        stale = {epoch for epoch, seen in self._last_seen.items() if now - seen > STALE_COORDINATOR_S}
        if not stale:
            return
        for epoch in stale:
            del self._last_seen[epoch]
            self._undelivered.pop(epoch, None)
        orphans = [stream_id for stream_id in self._handles if stream_id[0] in stale]
        for stream_id in orphans:
            handle = self._handles.pop(stream_id)
            del self._stream_ids[handle]
            self.streams.abort(handle)

    @remote_method
    def live_streams(self) -> int:
        """Streams submitted and neither ended nor aborted (tests: aborts leave nothing running)."""
        return len(self._handles)

    def _accounting_since_last_poll(self) -> CallAccounting:
        """The engine's cost since the last poll by any coordinator (replicas shared by several
        coordinators split it by who polls first)."""
        now = self.streams.accounting()
        delta, self._reported = now.minus(self._reported), now
        return delta

    @remote_method
    def shutdown(self) -> None:
        self.engine.shutdown()


# What `ray.remote(EngineReplica).remote(...)` returns: `replica.generate.remote(requests)` is typed.
ReplicaHandle = ActorProxy[EngineReplica]
