"""One streaming step of a chain: the events that landed in, the actions to carry out.

Both streaming drivers, presto_ray/streaming.py (in process, on a StreamingEngine) and
actors/chain_actor.py (over Ray, through the coordinator), call `ChainStream.step` and only carry
what it returns, so the sequence the chain sees is written once: deliver the events (walk each
completion, note the partial tokens of fork points), drop the requests the walk made useless,
stop when the chain is done, else start what the chain asks for within the budget and ask for
wake-ups at new fork points (docs/streaming.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol

from presto_ray.chain import Chain, StartRequest, StreamKey
from presto_ray.early_rejection import RejectionBound
from presto_ray.engines.base import Completion


class RequestEvent(Protocol):
    """What happened to one of the chain's running requests: it ended (`completion` or `error`)
    or reached a fork point (`partial`: its tokens so far)."""

    @property
    def key(self) -> StreamKey: ...

    @property
    def partial(self) -> tuple[int, ...] | None: ...

    @property
    def completion(self) -> Completion | None: ...

    @property
    def error(self) -> str | None: ...


@dataclass(frozen=True)
class StreamEvent:
    """A RequestEvent built by an in-process driver."""

    key: StreamKey
    partial: tuple[int, ...] | None = None
    completion: Completion | None = None
    error: str | None = None


@dataclass(frozen=True)
class StreamActions:
    """What the driver must do after a step. `done`: the chain is finished (its remaining requests
    are in `aborts`; nothing starts); `transitions`: MH transitions the step's events completed."""

    aborts: tuple[StreamKey, ...]
    starts: tuple[StartRequest, ...]
    wakes: tuple[tuple[StreamKey, int], ...]  # (running request, token count that unlocks a fork)
    done: bool
    transitions: int
    bounds: tuple[tuple[StreamKey, tuple[RejectionBound, ...]], ...] = ()  # running request -> its new rejection bounds


class StreamRequestError(RuntimeError):
    """An engine refused or lost one of a streaming chain's requests."""


class ChainStream:
    """A chain's side of the streaming schedule. Call `step()` once with no events to start, then
    with each batch of events for the chain until `done`."""

    def __init__(self, chain: Chain) -> None:
        self.chain = chain
        # wake-ups asked for per running request: each fork point is asked for once
        self._woken: dict[StreamKey, set[int]] = {}

    def step(self, events: Iterable[RequestEvent] = (), budget: int | None = None) -> StreamActions:
        """Deliver `events` in order, then plan: `budget` caps the requests kept running (None:
        the chain's `prefetch_budget`; drivers lower it under load, presto_ray/speculation.py)."""
        chain = self.chain
        transitions = 0
        for event in events:
            if not chain.is_running(event.key):
                continue  # dropped by the chain after the event left its engine
            if event.error is not None:
                raise StreamRequestError(event.error)
            if event.completion is not None:
                self._woken.pop(event.key, None)
                transitions += chain.complete(event.key, event.completion).transitions
            else:
                chain.observe_progress(event.key, event.partial or ())
        aborts = tuple(chain.useless_requests())
        for key in aborts:
            self._woken.pop(key, None)
        if chain.done:
            return StreamActions(aborts, (), (), True, transitions)
        starts = tuple(chain.start_requests(budget))
        wakes = []
        for key, needed in chain.fork_points().items():
            asked = self._woken.setdefault(key, set())
            if needed not in asked:
                asked.add(needed)
                wakes.append((key, needed))
        bounds = tuple(chain.bound_updates())
        return StreamActions(aborts, starts, tuple(wakes), False, transitions, bounds)
