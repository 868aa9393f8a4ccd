"""The coordinator's view of its engine replicas: one handle-free record per replica, shared by the
call book (rounds) and the stream book (streaming). Pure: no Ray, no asyncio, no clock.

A replica is healthy until a call or stream on it fails because it died, and healthy again when a
probe answers; retiring replicas take no new work; retired ones (stopped by the pool) are never
routed to or probed again. Positions in the table never move: the actor keeps its handles in the
same order, and `cluster_index` says which of the cluster's replicas a record is.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from actors.coordinator_commands import ReplicaLost
from actors.coordinator_stats import CoordinatorCounters
from actors.replica_choice import choose_replica, prefix_key, rendezvous_order
from presto_ray.engines.base import ProposalRequest

T = TypeVar("T")


@dataclass
class QueuedRequest:
    """A request waiting in a replica's queue for its next call."""

    request: ProposalRequest
    enqueued: float
    group: Hashable  # the request (group of chains) that first asked: calls are shared fairly by group
    attempts: int = 0  # replicas that died while serving it


@dataclass
class ReplicaRecord:
    """One replica's state as the coordinator keeps it."""

    cluster_index: int
    healthy: bool = True
    retiring: bool = False  # no new work; its running work ends where it is
    retired: bool = False  # gone for good (killed by the pool)
    queue: deque[QueuedRequest] = field(default_factory=deque)
    inflight_calls: int = 0
    inflight_requests: int = 0
    calls_made: int = 0
    live_streams: int = 0  # streams placed here, neither ended nor aborted

    @property
    def available(self) -> bool:
        """Takes new work."""
        return self.healthy and not self.retiring


class ReplicaTable:
    """The replicas one coordinator drives, by position (0..n-1), with the shared routing rule."""

    def __init__(self, cluster_indices: Sequence[int], *, affinity_tokens: int, affinity_slack: int) -> None:
        self.records = [ReplicaRecord(i) for i in cluster_indices]
        self.affinity_tokens, self.affinity_slack = affinity_tokens, affinity_slack

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> ReplicaRecord:
        return self.records[i]

    def add(self, cluster_index: int) -> int:
        """A new replica; its position."""
        self.records.append(ReplicaRecord(cluster_index))
        return len(self.records) - 1

    def position(self, cluster_index: int) -> int:
        for i, record in enumerate(self.records):
            if record.cluster_index == cluster_index:
                return i
        raise ValueError(f"replica {cluster_index} is not driven by this coordinator")

    def cluster_indices(self) -> list[int]:
        return [r.cluster_index for r in self.records]

    def lose(self, i: int, counters: CoordinatorCounters) -> list[ReplicaLost]:
        """Replica i died under a call or stream: stop using it until a probe answers (one probe
        per outage). Nothing for a replica the pool retired on purpose."""
        record = self.records[i]
        if record.retired:
            return []
        counters.replica_failures += 1
        was_healthy, record.healthy = record.healthy, False
        return [ReplicaLost(i, probe=was_healthy)]

    def ranking(self, request: ProposalRequest) -> list[int]:
        """Replicas by rendezvous weight for the prompt's first tokens: adding or losing a replica
        moves only the prompts it held."""
        order = rendezvous_order(prefix_key(request.prompt_token_ids, self.affinity_tokens), len(self.records))
        return [i for i in order if not self.records[i].retired]

    def choose(self, request: ProposalRequest, load: Callable[[int], int], avoid: int | None = None) -> tuple[int, bool]:
        """Where `request` goes (actors/replica_choice.py) and whether that misses its affinity."""
        ranking = self.ranking(request)
        target = choose_replica(
            ranking, load, available=lambda i: self.records[i].available, healthy=lambda i: self.records[i].healthy,
            slack=self.affinity_slack, avoid=avoid,
        )  # fmt: skip
        return target, target != ranking[0]

    def any_healthy(self) -> bool:
        return any(r.healthy for r in self.records)

    def taking_work(self) -> list[int]:
        return [i for i, r in enumerate(self.records) if r.available]

    def by_cluster_index(self, value: Callable[[ReplicaRecord], T], absent: T, size: int) -> list[T]:
        """`value` of each record at its cluster index in a list of `size` (others: `absent`)."""
        out = [absent] * size
        for record in self.records:
            out[record.cluster_index] = value(record)
        return out
