"""An engine replica: one actor owning one engine (vLLM on a GPU, vLLM on the CPU, or the toy)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

from actors.stream_protocol import ReplicaEvent, ReplicaEvents, ReplicaStart, StreamId
from presto_ray.engines import CallAccounting, EngineOutput, EngineSpec, ProposalRequest, build_engine


class EngineReplica:
    """Runs batched calls (rounds) and per-request streams (streaming) on its engine. Async, so that
    a slow call never blocks `ready` probes.

    vLLM calls overlap (its own scheduler batches them); the toy serves one call at a time, in a
    worker thread, like a device that runs one batch at once. Streams run on the engine's streaming
    form (`Engine.streaming()`), named by the coordinator's `StreamId`s; the coordinator long-polls
    `stream_events` for what happened to them.
    """

    def __init__(self, engine_spec: EngineSpec, replica_index: int) -> None:
        self.replica_index = replica_index
        self.engine = build_engine(engine_spec)
        self._stream_engine = None
        self._handles: dict[StreamId, int] = {}
        self._stream_ids: dict[int, StreamId] = {}
        self._refused: list[ReplicaEvent] = []
        self._work = asyncio.Event()
        self._reported = CallAccounting()

    def ready(self) -> dict:
        return {"replica": self.replica_index, "pid": os.getpid(), "eos_token_id": self.engine.eos_token_id}

    async def generate(self, requests: Sequence[ProposalRequest]) -> EngineOutput:
        return await self.engine.agenerate(requests)

    # --- streams ------------------------------------------------------------------------------
    @property
    def streams(self):
        if self._stream_engine is None:
            self._stream_engine = self.engine.streaming()
        return self._stream_engine

    async def free_batch(self) -> float:
        """Sequences this replica runs before speculation stops paying (presto_ray/speculation.py)."""
        return float(self.streams.free_batch)

    async def stream_submit(self, starts: Sequence[ReplicaStart]) -> None:
        engine = self.streams
        for start in starts:
            try:
                handle = engine.submit(start.request, start.priority)
            except Exception as error:  # refused (e.g. over the context): the chain fails with the reason
                self._refused.append(ReplicaEvent(start.stream_id, 0, error=f"{type(error).__name__}: {error}"))
                continue
            self._handles[start.stream_id], self._stream_ids[handle] = handle, start.stream_id
            for generated in start.wakes:
                engine.wake_at(handle, generated)
        self._work.set()

    async def stream_wake(self, wakes: Sequence[tuple[StreamId, int]]) -> None:
        for stream_id, generated in wakes:
            handle = self._handles.get(stream_id)
            if handle is not None:
                self.streams.wake_at(handle, generated)

    async def stream_abort(self, stream_ids: Sequence[StreamId]) -> None:
        for stream_id in stream_ids:
            handle = self._handles.pop(stream_id, None)
            if handle is not None:
                del self._stream_ids[handle]
                self.streams.abort(handle)

    async def stream_events(self, timeout_s: float) -> ReplicaEvents:
        """What happened to the streams since the last poll: waits (at most `timeout_s`) for something."""
        engine = self.streams
        if not self._refused and not engine.busy:
            self._work.clear()
            try:
                await asyncio.wait_for(self._work.wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
        events, self._refused = self._refused, []
        if engine.busy:
            for event in await engine.next_events(timeout_s):
                stream_id = self._stream_ids.get(event.handle)
                if stream_id is None:
                    continue
                ended = event.completion is not None or event.error is not None
                if ended:
                    del self._stream_ids[event.handle], self._handles[stream_id]
                error = None if event.error is None else f"{type(event.error).__name__}: {event.error}"
                partial = None if ended else tuple(engine.partial_tokens(event.handle))
                events.append(ReplicaEvent(stream_id, event.generated, partial, event.completion, error))
        return ReplicaEvents(tuple(events), self._accounting_since_last_poll())

    def live_streams(self) -> int:
        """Streams submitted and neither ended nor aborted (tests: aborts leave nothing running)."""
        return len(self._handles)

    def _accounting_since_last_poll(self) -> CallAccounting:
        now = self.streams.accounting()
        delta = CallAccounting(**{name: getattr(now, name) - getattr(self._reported, name) for name in vars(now)})
        self._reported = now
        return delta

    def shutdown(self) -> None:
        self.engine.shutdown()
