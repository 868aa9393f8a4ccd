"""The streaming schedule's in-process driver: requests start as chains ask, and each completion
goes to its chain the moment it lands (ALGORITHM.md section 4b).

The loop is plumbing only: every decision (which requests, their priorities, fork points, which
requests became useless) is the chain's, and how many may run is presto_ray/speculation.py's.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

from presto_ray.chain import Chain, StreamKey
from presto_ray.engines.base import Completion, ProposalRequest
from presto_ray.speculation import streaming_budget


class EngineEvent(Protocol):
    handle: int
    generated: int
    completion: Completion | None  # None: a fork point was reached, the request runs on
    error: BaseException | None  # the engine refused or lost the request (advance raises it)


class StreamingEngine(Protocol):
    """Per-request submission with completion events, partial tokens, abort and priority."""

    busy: bool
    free_batch: float  # sequences the device runs before speculation stops paying (inf: unlimited)

    def submit(self, request: ProposalRequest, priority: float = 0.0) -> int: ...

    def wake_at(self, handle: int, generated: int) -> None: ...

    def partial_tokens(self, handle: int) -> tuple[int, ...]: ...

    def abort(self, handle: int) -> None: ...

    def advance(self) -> Sequence[EngineEvent]: ...

    async def next_events(self, timeout_s: float) -> Sequence[EngineEvent]:
        """`advance` for an event loop: waits at most `timeout_s`, reports errors as events."""
        ...


def run_streaming(
    engine: StreamingEngine, chains: Sequence[Chain], on_finished: Callable[[int], None] | None = None
) -> None:
    """Drive every chain to the end; `on_finished(i)` is called as chain i finishes."""
    handles: dict[tuple[int, StreamKey], int] = {}
    active = [len(chains)]  # chains not finished: they share the device's free batch
    owners: dict[int, tuple[int, StreamKey]] = {}

    def pump(i: int) -> None:
        chain = chains[i]
        for key in chain.useless_requests():
            handle = handles.pop((i, key))
            del owners[handle]
            engine.abort(handle)
        if chain.done:
            active[0] -= 1
            if on_finished is not None:
                on_finished(i)
            return
        budget = streaming_budget(chain.config.prefetch_budget, active[0], engine.free_batch)
        for start in chain.start_requests(budget):
            handle = engine.submit(start.request, start.priority)
            handles[(i, start.key)], owners[handle] = handle, (i, start.key)
        for key, needed in chain.fork_points().items():
            engine.wake_at(handles[(i, key)], needed)

    for i in range(len(chains)):
        pump(i)
    while engine.busy:
        for event in engine.advance():
            owner = owners.get(event.handle)
            if owner is None:
                continue  # aborted after it ended, within this batch of events
            i, key = owner
            if event.completion is not None:
                del handles[owner], owners[event.handle]
                chains[i].complete(key, event.completion)
            else:
                chains[i].observe_progress(key, engine.partial_tokens(event.handle))
            pump(i)
    unfinished = [i for i, chain in enumerate(chains) if not chain.done]
    if unfinished:
        raise RuntimeError(f"the engine went idle with chains {unfinished[:5]} unfinished")
