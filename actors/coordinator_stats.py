"""The coordinator's figures as one typed snapshot. Plain dataclasses: no Ray needed to read them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TypeVar

from presto_ray.engines.base import CallAccounting


@dataclass
class CoordinatorCounters:
    """What the coordinator itself counts; what calls cost is summed in a CallAccounting."""

    submitted_requests: int = 0  # requests chains asked for
    deduplicated: int = 0  # asked-for requests served by another chain's identical request
    chains_finished: int = 0
    chains_abandoned: int = 0  # of those, chains whose driver was cancelled mid-call (a client left)
    chains_expired: int = 0  # chains silent past chain_idle_timeout_s, no longer waited for
    replica_failures: int = 0  # calls lost to a dead replica (their requests were re-sent)
    resent_requests: int = 0
    max_queue_depth: int = 0
    max_requests_per_call: int = 0
    affinity_misses: int = 0  # requests sent away from their prompt's preferred replica
    streamed_requests: int = 0  # streaming: requests sent to replicas one by one (after dedup)
    stream_aborts: int = 0  # streaming: requests aborted on their replica (no chain wanted them)

    @classmethod
    def combine(cls, parts: list["CoordinatorCounters"]) -> "CoordinatorCounters":
        """Several coordinators' counters as one: sums, and the largest of each `max_*`."""
        return cls(**{
            f.name: (max if f.name.startswith("max_") else sum)(getattr(p, f.name) for p in parts) for f in fields(cls)
        })  # fmt: skip


@dataclass(frozen=True)
class CoordinatorSnapshot:
    """`Coordinator.snapshot()`: counters, call costs and per-replica state at one moment.

    The per-replica lists are indexed by the cluster's replica index (`replica_ids[k]` is the
    index of a coordinator's k-th replica; a shard drives only some of them)."""

    counters: CoordinatorCounters
    accounting: CallAccounting  # every call's cost, as the replicas measured it (retries included)
    calls_per_replica: list[int] = field(default_factory=list)
    inflight_calls_per_replica: list[int] = field(default_factory=list)
    inflight_requests_per_replica: list[int] = field(default_factory=list)
    healthy: list[bool] = field(default_factory=list)
    queue_depth: int = 0
    chains_active: int = 0
    streams_running: int = 0  # streaming schedule: requests sent to replicas and neither ended nor aborted
    active_replicas: int = 0  # replicas taking new work (not retiring); summed over shards
    shards: int = 1
    # shards whose figures miss some of their work: restarted by Ray (their counts began again) or
    # not answering (lost, restarting) when asked with `lost_ok`
    incomplete_shards: int = 0

    @classmethod
    def unanswered(cls) -> "CoordinatorSnapshot":
        """What a shard that did not answer contributes: nothing but its being incomplete."""
        return cls(counters=CoordinatorCounters(), accounting=CallAccounting(), incomplete_shards=1)

    @classmethod
    def combine(cls, parts: list["CoordinatorSnapshot"]) -> "CoordinatorSnapshot":
        """The shards' snapshots as the cluster's: counters and costs summed, per-replica figures
        summed over the shards that drive each replica (healthy only if all of them see it so)."""
        if len(parts) == 1:
            return parts[0]
        n = max(len(p.calls_per_replica) for p in parts)
        accounting = CallAccounting()
        for p in parts:
            accounting.add(p.accounting)

        def summed(name: str) -> list[int]:  # shards that have not heard of a replica yet count 0
            return [sum(_at(getattr(p, name), i, 0) for p in parts) for i in range(n)]

        return cls(
            counters=CoordinatorCounters.combine([p.counters for p in parts]),
            accounting=accounting,
            calls_per_replica=summed("calls_per_replica"),
            inflight_calls_per_replica=summed("inflight_calls_per_replica"),
            inflight_requests_per_replica=summed("inflight_requests_per_replica"),
            healthy=[all(_at(p.healthy, i, True) for p in parts) for i in range(n)],
            queue_depth=sum(p.queue_depth for p in parts),
            chains_active=sum(p.chains_active for p in parts),
            shards=sum(p.shards for p in parts),
            streams_running=sum(p.streams_running for p in parts),
            active_replicas=sum(p.active_replicas for p in parts),
            incomplete_shards=sum(p.incomplete_shards for p in parts),
        )

    @property
    def ongoing_requests(self) -> int:
        """Proposal requests the engines owe: queued, in a call, or streaming (the autoscaler's load)."""
        return self.queue_depth + sum(self.inflight_requests_per_replica) + self.streams_running

    @property
    def requests_per_call(self) -> float:
        a = self.accounting
        return a.num_requests / a.calls if a.calls else 0.0

    @property
    def cached_token_share(self) -> float:
        a = self.accounting
        return a.cached_prompt_tokens / a.prompt_tokens if a.prompt_tokens else 0.0


T = TypeVar("T")


def _at(values: Sequence[T], i: int, absent: T) -> T:
    return values[i] if i < len(values) else absent
