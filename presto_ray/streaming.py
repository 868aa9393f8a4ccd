"""The streaming schedule's in-process driver: requests start as chains ask, and what lands goes to
its chain at once: each chain takes all its events of one engine advance in one step
(docs/streaming.md).

The loop is transport only: what to do after each event is `ChainStream.step`'s
(presto_ray/chain_stream.py, shared with the Ray driver), how many requests may run is
presto_ray/speculation.py's.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Sequence

from presto_ray.chain import Chain, ProposalKey
from presto_ray.chain_stream import ChainStream, StreamActions, StreamEvent
from presto_ray.collector import COLLECTION_THRESHOLDS, collecting_less
from presto_ray.engines.base import EngineEvent, StreamingEngine
from presto_ray.speculation import budget_by_load

__all__ = ["COLLECTION_THRESHOLDS", "collecting_less", "run_streaming"]


def run_streaming(
    engine: StreamingEngine,
    chains: Sequence[Chain],
    on_finished: Callable[[int], None] | None = None,
    *,
    max_active_chains: int | None = None,
    on_started: Callable[[int], None] | None = None,
) -> None:
    """Drive every chain to the end, at most `max_active_chains` at once (None: all), in input
    order; `on_started(i)` / `on_finished(i)` are called as chain i starts and finishes. The loop
    collects less (presto_ray/collector.py)."""
    with collecting_less():
        _run(engine, chains, on_finished, max_active_chains, on_started)


def _run(
    engine: StreamingEngine,
    chains: Sequence[Chain],
    on_finished: Callable[[int], None] | None,
    max_active_chains: int | None,
    on_started: Callable[[int], None] | None,
) -> None:
    limit = max_active_chains or max(1, len(chains))
    streams = [ChainStream(chain) for chain in chains]
    handles: dict[tuple[int, ProposalKey], int] = {}
    owners: dict[int, tuple[int, ProposalKey]] = {}
    waiting = deque(range(len(chains)))  # chains not started yet
    active = 0  # chains started and not finished: they share the device's free batch

    def start_waiting() -> None:
        nonlocal active
        while waiting and active < limit:
            i = waiting.popleft()
            active += 1
            if on_started is not None:
                on_started(i)
            step(i)

    def carry_out(i: int, actions: StreamActions) -> None:
        nonlocal active
        for key in actions.aborts:
            handle = handles.pop((i, key))
            del owners[handle]
            engine.abort(handle)
        if actions.done:
            active -= 1
            if on_finished is not None:
                on_finished(i)
            return
        for start in actions.starts:
            handle = engine.submit(start.request, start.priority)
            handles[(i, start.key)], owners[handle] = handle, (i, start.key)
        for key, needed in actions.wakes:
            engine.wake_at(handles[(i, key)], needed)
        for key, bounds in actions.bounds:
            engine.set_rejection_bounds(handles[(i, key)], bounds)

    def step(i: int, events: Sequence[StreamEvent] = ()) -> None:
        budget = budget_by_load(chains[i].config.prefetch_budget, active, engine.free_batch)
        carry_out(i, streams[i].step(events, budget))

    start_waiting()
    while engine.busy:
        # a chain takes all its events of one advance in one step: one plan for what landed at
        # once (as the Ray driver's chains do), not one per event
        landed: dict[int, list[tuple[ProposalKey, EngineEvent]]] = {}
        for event in engine.advance():
            owner = owners.get(event.handle)
            if owner is None:
                continue  # aborted after it ended
            i, key = owner
            if event.ended:
                del handles[owner], owners[event.handle]
            landed.setdefault(i, []).append((key, event))
        for i, events in landed.items():
            # partial tokens read as the chain steps: an engine that runs meanwhile has more
            step(i, [_chain_event(engine, key, event) for key, event in events])
        start_waiting()  # in the place of the chains that finished
    unfinished = [i for i, chain in enumerate(chains) if not chain.done]
    if unfinished:
        raise RuntimeError(f"the engine went idle with chains {unfinished[:5]} unfinished")
    leftover = [i for i, stream in enumerate(streams) if stream.running_requests]
    if leftover:
        raise RuntimeError(f"chains {leftover[:5]} finished with requests still running")


def _chain_event(engine: StreamingEngine, key: ProposalKey, event: EngineEvent) -> StreamEvent:
    """The chain's view of an engine event (a refused or lost request fails its chain with the
    engine's reason, as over Ray)."""
    if event.completion is not None:
        return StreamEvent(key, completion=event.completion)
    if event.error is not None:
        return StreamEvent(key, error=event.reason)
    return StreamEvent(key, partial=engine.partial_tokens(event.handle))
