"""What the coordinator's books (actors/call_book.py, actors/stream_book.py) ask the actor to do.

The books take events and return these commands; the actor (actors/coordinator.py) carries them
out: every `.remote()`, every future and every task is the actor's. Plain frozen dataclasses, so a
test asserts the exact commands an event produced.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Union

from actors.stream_protocol import ReplicaStart, StreamId

# How a request that gave up after `ray.max_call_attempts` dying replicas fails its chains (both
# books say it); the stage (actors/stage_base.py) ends the job in one line when it sees it.
REPLICAS_LOST = "dying replicas"


def replicas_lost(attempts: int) -> str:
    return f"request failed on {attempts} {REPLICAS_LOST}"
from presto_ray.early_rejection import RejectionBound
from presto_ray.engines.base import Completion, ProposalRequest


@dataclass(frozen=True)
class SendCall:
    """Send these requests to replica `replica` as one batched call; report back by `call_id`."""

    call_id: int
    replica: int
    requests: tuple[ProposalRequest, ...]


@dataclass(frozen=True)
class Settle:
    """Answer every chain waiting on `request`: with its completion, or fail them with `error`."""

    request: ProposalRequest
    completion: Completion | None = None
    error: BaseException | None = None


@dataclass(frozen=True)
class ReplicaLost:
    """Replica `replica` died (count it); `probe`: start waiting for Ray to restart it."""

    replica: int
    probe: bool


@dataclass(frozen=True)
class StartStreams:
    replica: int
    starts: tuple[ReplicaStart, ...]


@dataclass(frozen=True)
class WakeStreams:
    """Fork points asked for: (stream, token count) pairs."""

    replica: int
    wakes: tuple[tuple[StreamId, int], ...]


@dataclass(frozen=True)
class BoundStreams:
    """New early-rejection bounds for running streams: (stream, bounds) pairs."""

    replica: int
    bounds: tuple[tuple[StreamId, tuple[RejectionBound, ...]], ...]


@dataclass(frozen=True)
class AbortStreams:
    replica: int
    stream_ids: tuple[StreamId, ...]


@dataclass(frozen=True)
class PollReplica:
    """Start long-polling replica `replica`'s stream events (once per replica)."""

    replica: int


@dataclass(frozen=True)
class WakeChains:
    """These chains' mailboxes changed (events landed, or the mailbox closed): wake their exchanges."""

    chain_ids: tuple[Hashable, ...]


Command = Union[SendCall, Settle, ReplicaLost, StartStreams, WakeStreams, BoundStreams, AbortStreams, PollReplica, WakeChains]
