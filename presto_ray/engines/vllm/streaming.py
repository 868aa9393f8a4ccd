"""VLLMStreamingEngine: the vLLM engine's per-request form (base.StreamingEngine), for the
streaming schedule (docs/streaming.md).

Each request is one vLLM request streamed with DELTA outputs on the runtime's event loop: its
tokens and their log-probabilities (log q_tau, and log p0 and the entropy from the wrapped
sampler, read by the same codec as the batch path) accumulate as they are decoded, a fork point
the chain asked for raises an event as soon as the request has that many tokens, and when it ends
it raises its completion event (after the scoring pass, when the codec scores separately). Abort
is vLLM's `AsyncLLM.abort`; priority is vLLM's priority scheduling (lower first). The driver's
thread blocks in `advance` on a queue the loop thread fills.

Exact early rejection runs next to the tokens, on the loop thread: each request's `TokenReader`
(codec.py) pushes every new token into the request's stop rule as its delta is read, and the
moment every bound the request carries rejects, the runtime aborts the vLLM request
(`VLLMRuntime.sample`, shared with the batch path) and its completion event follows at once with
the tokens up to the firing one, finish reason "rejected". The walk may replace a running
request's bounds (`set_rejection_bounds`, when its nodes' state changes): the new rule follows the
tokens it has, and stops it at once where they already reject. No per-token event crosses to the
driver or the coordinator. With `logp0_from: scoring_pass` the bounds are ignored (log p0 is known
only after the proposal ends).
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Sequence

from presto_ray.early_rejection import RejectionBound
from presto_ray.engines.base import CallAccounting, Completion, EngineEvent, ProposalRequest
from presto_ray.engines.vllm.codec import RequestOutput, TokenReader, VLLMCodec, empty_completion, scored_tokens
from presto_ray.engines.vllm.runtime import VLLMRuntime

# vLLM's priorities are integers: a reach-based priority in [0, 1] keeps three digits.
PRIORITY_SCALE = 1000


@dataclass
class _Live:
    reader: TokenReader  # the request, its tokens and columns so far, its early-rejection stop
    request_id: str
    wakes: set[int] = field(default_factory=set)
    future: Future[None] | None = None

    @property
    def request(self) -> ProposalRequest:
        return self.reader.request

    @property
    def tokens(self) -> list[int]:
        return self.reader.tokens


@dataclass
class StreamStats:
    generated_tokens: int = 0  # decoded, aborted and early-stopped requests' tokens included
    aborted_requests: int = 0
    wasted_tokens: int = 0  # decoded by requests aborted before they ended
    early_stopped_requests: int = 0  # ended by exact early rejection (vLLM request aborted there)


class VLLMStreamingEngine:
    """Streams on `runtime`'s AsyncLLM, read by `codec`; `free_batch`: sequences the chains share
    (VLLMEngineConfig.free_batch)."""

    def __init__(self, runtime: VLLMRuntime, codec: VLLMCodec, *, free_batch: float) -> None:
        self.runtime = runtime
        self.codec = codec
        self.eos_token_id = codec.eos_token_id
        self.free_batch = free_batch
        self.clock = StreamStats()
        self._handles = itertools.count()
        self._live: dict[int, _Live] = {}
        self._lock = threading.Lock()  # tokens, wakes and counters are shared with the loop thread
        self._events: queue.SimpleQueue[EngineEvent] = queue.SimpleQueue()
        self._accounting = CallAccounting()

    # --- StreamingEngine -------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return bool(self._live)

    def submit(self, request: ProposalRequest, priority: float = 0.0) -> int:
        self.codec.validate(request)
        handle = next(self._handles)
        live = _Live(TokenReader(self.codec, request), f"presto-stream-{id(self)}-{handle}")
        self._live[handle] = live
        with self._lock:
            self._accounting.num_requests += 1
            self._accounting.prompt_tokens += len(request.context_token_ids)
        live.future = self.runtime.submit(self._run(handle, live, round(priority * PRIORITY_SCALE)))
        return handle

    def wake_at(self, handle: int, generated: int) -> None:
        live = self._live.get(handle)
        if live is None:
            return
        with self._lock:
            if len(live.tokens) >= generated:
                self._events.put(EngineEvent(handle, len(live.tokens)))
            else:
                live.wakes.add(generated)

    def partial_tokens(self, handle: int) -> tuple[int, ...]:
        live = self._live.get(handle)
        if live is None:
            return ()
        with self._lock:
            return tuple(live.tokens)

    def abort(self, handle: int) -> None:
        live = self._live.pop(handle, None)
        if live is None:
            return
        with self._lock:
            self.clock.aborted_requests += 1
            self.clock.wasted_tokens += live.reader.decoded
        self.runtime.submit(self.runtime.abort(live.request_id))

    def set_rejection_bounds(self, handle: int, bounds: Sequence[RejectionBound]) -> None:
        """Replace a live request's bounds (`TokenReader.set_bounds`). When they reject the tokens it
        has, it stops there: the vLLM request is aborted, and its last (empty) output ends the
        stream, so its completion event follows ("rejected", with every token it has)."""
        live = self._live.get(handle)
        if live is None:
            return
        with self._lock:
            stopped = live.reader.set_bounds(bounds)
        if stopped:
            self.runtime.submit(self.runtime.abort(live.request_id))

    def advance(self) -> list[EngineEvent]:
        """Block until something happens; every event since, of requests still live (a refused
        request raises its error)."""
        events = self._accept(self._events.get())
        for event in events:
            if event.error is not None:
                raise event.error
        return events

    async def next_events(self, timeout_s: float) -> list[EngineEvent]:
        """`advance` for an event loop (an engine replica actor): waits in a worker thread, at
        most `timeout_s`, and returns a refused request's error as its event instead of raising."""
        try:
            first = await asyncio.to_thread(self._events.get, True, timeout_s)
        except queue.Empty:
            return []
        return self._accept(first)

    def _accept(self, first: EngineEvent) -> list[EngineEvent]:
        """`first` and every event queued since, of requests still live; ended ones are forgotten."""
        events = [first]
        while not self._events.empty():
            events.append(self._events.get_nowait())
        live = [e for e in events if e.handle in self._live]
        for event in live:
            if event.ended:
                del self._live[event.handle]
        return live

    def accounting(self) -> CallAccounting:
        """Requests submitted, their prompt and cached tokens, tokens decoded and scored."""
        with self._lock:
            return replace(self._accounting, generated_tokens=self.clock.generated_tokens)

    # --- on the runtime's loop ---------------------------------------------------------------
    async def _run(self, handle: int, live: _Live, priority: int) -> None:
        reader = live.reader
        try:
            if reader.request.max_new_tokens > 0:
                read = partial(self._append, handle, live)
                await self.runtime.sample(reader, live.request_id, priority, output="delta", read=read)
            if handle not in self._live:
                return  # aborted: nothing to score
            if reader.stopped:
                with self._lock:
                    self.clock.early_stopped_requests += 1
            completion = await self._finish(live) if reader.tokens else empty_completion()
            self._events.put(EngineEvent(handle, len(reader.tokens), completion))
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the engine refused the request: the chain fails with its message
            self._events.put(EngineEvent(handle, len(reader.tokens), error=error))

    def _append(self, handle: int, live: _Live, output: RequestOutput) -> None:
        """One DELTA output: its tokens (up to an early stop), counted, and the fork events it reaches."""
        with self._lock:
            decoded = live.reader.decoded
            live.reader.read(output)
            self.clock.generated_tokens += live.reader.decoded - decoded
            reached = {w for w in live.wakes if w <= len(live.tokens)}
            live.wakes -= reached
        if reached:
            self._events.put(EngineEvent(handle, len(live.tokens)))

    async def _finish(self, live: _Live) -> Completion:
        tokens = tuple(live.tokens)
        score = await self.runtime.score_if_separate(self.codec, live.request, tokens)
        with self._lock:
            self._accounting.cached_prompt_tokens += live.reader.cached
            self._accounting.scoring_tokens += scored_tokens(score)
        return live.reader.completion(score)
