"""What travels between the chains (in stage actors or Serve), the coordinator and engine replicas
when chains stream (docs/streaming.md). Plain frozen dataclasses: cheap to pickle, no Ray needed to
build them.

Chain -> coordinator: `ChainActions` (abort these, start those, wake me at these fork points, stop
those by these early-rejection bounds now), answered
by a `ChainUpdate` once at least one event for the chain has landed (a long poll: one round trip
per batch of events, no per-call barrier). Coordinator -> replica: `ReplicaStart`s, wakes, bounds and aborts
by `StreamId`; replica -> coordinator: `ReplicaEvents`, also a long poll.

`ChainActions` carries a `presto_ray.chain_stream.StreamActions` (its aborts, starts and wakes) and a
`ChainEvent` is a `presto_ray.chain_stream.RequestEvent`: the chain's side of the exchange is
`ChainStream.step`, the same as in process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from presto_ray.chain import ProposalKey
from presto_ray.chain_stream import StartRequest
from presto_ray.early_rejection import RejectionBound
from presto_ray.engines.base import CallAccounting, Completion, ProposalRequest

# A request as the coordinator names it on a replica: (the coordinator's epoch, a counter). The
# epoch tells a restarted coordinator's requests from the orphans of the one before.
StreamId = tuple[str, int]


class StreamLost(RuntimeError):
    """The coordinator no longer holds this chain's stream (it restarted, or the chain was opened
    again elsewhere): the driver replays the chain from its keys."""


@dataclass(frozen=True)
class ChainActions:
    abort: tuple[ProposalKey, ...] = ()
    start: tuple[StartRequest, ...] = ()
    wakes: tuple[tuple[ProposalKey, int], ...] = ()  # (running request, token count that unlocks a fork)
    bounds: tuple[tuple[ProposalKey, tuple[RejectionBound, ...]], ...] = ()  # running request -> its new rejection bounds


@dataclass(frozen=True)
class ChainEvent:
    """A request of the chain reached a fork point (`partial` set) or ended (`completion` or `error`).
    A `presto_ray.chain_stream.RequestEvent`: `ChainStream.step` takes it as it arrives."""

    key: ProposalKey
    generated: int
    partial: tuple[int, ...] | None = None
    completion: Completion | None = None
    error: str | None = None


@dataclass(frozen=True)
class ChainUpdate:
    events: tuple[ChainEvent, ...]
    budget: int  # requests the chain may keep running now (its share of the replicas' free batch)


@dataclass(frozen=True)
class ReplicaStart:
    stream_id: StreamId
    request: ProposalRequest
    priority: float
    wakes: tuple[int, ...] = ()  # fork points already asked for (a request re-sent after its replica died)


@dataclass(frozen=True)
class ReplicaEvent:
    stream_id: StreamId
    generated: int
    partial: tuple[int, ...] | None = None
    completion: Completion | None = None
    error: str | None = None

    @property
    def ended(self) -> bool:
        return self.completion is not None or self.error is not None


@dataclass(frozen=True)
class ReplicaEvents:
    events: tuple[ReplicaEvent, ...]
    accounting: CallAccounting = field(default_factory=CallAccounting)  # cost since the previous poll
