"""The coordinator's figures as one typed snapshot. Plain dataclasses: no Ray needed to read them."""

from __future__ import annotations

from dataclasses import dataclass, field

from presto_ray.engines.base import CallAccounting


@dataclass
class CoordinatorCounters:
    """What the coordinator itself counts; what calls cost is summed in a CallAccounting."""

    submitted_requests: int = 0  # requests chains asked for
    deduplicated: int = 0  # asked-for requests served by another chain's identical request
    chains_finished: int = 0
    replica_failures: int = 0  # calls lost to a dead replica (their requests were re-sent)
    resent_requests: int = 0
    max_queue_depth: int = 0
    max_requests_per_call: int = 0
    affinity_misses: int = 0  # requests sent away from their prompt's preferred replica
    streamed_requests: int = 0  # streaming: requests sent to replicas one by one (after dedup)
    stream_aborts: int = 0  # streaming: requests aborted on their replica (no chain wanted them)


@dataclass(frozen=True)
class CoordinatorSnapshot:
    """`Coordinator.snapshot()`: counters, call costs and per-replica state at one moment."""

    counters: CoordinatorCounters
    accounting: CallAccounting  # every call's cost, as the replicas measured it (retries included)
    calls_per_replica: list[int] = field(default_factory=list)
    inflight_calls_per_replica: list[int] = field(default_factory=list)
    healthy: list[bool] = field(default_factory=list)
    queue_depth: int = 0
    chains_active: int = 0
    streams_running: int = 0  # streaming schedule: requests sent to replicas and neither ended nor aborted

    @property
    def requests_per_call(self) -> float:
        a = self.accounting
        return a.num_requests / a.calls if a.calls else 0.0

    @property
    def cached_token_share(self) -> float:
        a = self.accounting
        return a.cached_prompt_tokens / a.prompt_tokens if a.prompt_tokens else 0.0
