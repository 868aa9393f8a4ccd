"""TransformersStreamingEngine: the transformers engine's per-request form (base.StreamingEngine),
for the streaming schedule (docs/streaming.md).

A request is one sequence of the continuous batcher (runner.py): it waits for a slot in priority
order (lower first), decodes one token per step with the others, and its completion event comes
the step it ends, its slot going to the next waiting request. `wake_at` raises an event the step
the request reaches a fork point's token count; `partial_tokens` are final (a proposal never
rewrites them); `abort` frees the slot at once (its KV goes to the prefix cache, where a later
request may reuse it). A request whose early-rejection bounds all reject ends as "rejected" the
step they do, and `set_rejection_bounds` replays the tokens a request has against new bounds,
ending it at once (with all of them) where they reject. No per-token event leaves the engine.

`advance` runs steps in the caller's thread until something happens. In an engine replica,
`next_events` runs them in a worker thread while the actor's loop submits and aborts: every call
takes the engine's lock, so a submit made during a step waits for that step to end.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Sequence

from presto_ray.early_rejection import RejectionBound
from presto_ray.engines.base import CallAccounting, EngineEvent, ProposalRequest
from presto_ray.engines.transformers.runner import BatchRunner, RunnerStats


class TransformersStreamingEngine:
    """Per-request streams on one runner; `free_batch`: sequences the chains share."""

    def __init__(self, runner: BatchRunner, *, free_batch: float) -> None:
        self.runner = runner
        self.free_batch = free_batch
        self.eos_token_id = runner.eos_token_id
        self._lock = threading.RLock()

    @property
    def clock(self) -> RunnerStats:
        """Steps, tokens decoded, aborts and early stops so far."""
        return self.runner.stats

    @property
    def busy(self) -> bool:
        with self._lock:
            return self.runner.busy

    def submit(self, request: ProposalRequest, priority: float = 0.0) -> int:
        with self._lock:
            return self.runner.submit(request, priority)

    def wake_at(self, handle: int, generated: int) -> None:
        with self._lock:
            self.runner.wake_at(handle, generated)

    def partial_tokens(self, handle: int) -> tuple[int, ...]:
        with self._lock:
            return self.runner.partial_tokens(handle)

    def abort(self, handle: int) -> None:
        with self._lock:
            self.runner.abort(handle)

    def set_rejection_bounds(self, handle: int, bounds: Sequence[RejectionBound]) -> None:
        with self._lock:
            self.runner.set_rejection_bounds(handle, bounds)

    def advance(self) -> list[EngineEvent]:
        """Steps until something happens; its events (a request the device failed raises its error)."""
        events = self._step_until(None)
        for event in events:
            if event.error is not None:
                raise event.error
        return events

    async def next_events(self, timeout_s: float) -> list[EngineEvent]:
        """`advance` for an event loop: steps in a worker thread for at most about `timeout_s`
        (a step under way finishes), errors returned as events."""
        return await asyncio.to_thread(self._step_until, time.monotonic() + timeout_s)

    def _step_until(self, deadline: float | None) -> list[EngineEvent]:
        while True:
            with self._lock:
                if not self.runner.busy:
                    return []
                events = self.runner.step()
                if not events and not self.runner.running and self.runner.busy:
                    raise RuntimeError("the transformers engine has requests but runs none")
            if events or (deadline is not None and time.monotonic() >= deadline):
                return events

    def accounting(self) -> CallAccounting:
        """Requests submitted, their context and cached tokens, and tokens decoded (aborted and
        early-stopped requests' included), since this form was made."""
        with self._lock:
            return self.runner.accounting()
