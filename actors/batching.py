"""When the coordinator sends a replica's queue as one call: a pure policy, testable on a fake clock.

A replica's queue is dispatched when any of these holds:
  - the round is released: every active chain has planned (nobody else will add to it), or no
    chain has submitted and no call has finished for `batch_window_s` (a quiet period: chains
    still planning keep the batch open while their plans keep arriving);
  - its oldest request has waited `max_batch_wait_s` (a bound on added latency);
  - it holds `max_requests_per_call` requests.
and the replica runs fewer than `max_inflight_calls` calls. Times are seconds on any clock.
When the queue holds more than one call takes, `fair_take` picks round robin over requests (groups
of chains), and streaming budgets are split per group first (`fair_competitors`): one request's
chains never starve another's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from presto_ray.ray_config import RayConfig


@dataclass(frozen=True)
class BatchingPolicy:
    batch_window_s: float
    max_batch_wait_s: float
    max_requests_per_call: int
    max_inflight_calls: int

    @classmethod
    def from_settings(cls, settings: RayConfig) -> "BatchingPolicy":
        """From a RayConfig (the `ray:` config section)."""
        return cls(settings.batch_window_s, settings.max_batch_wait_s, settings.max_requests_per_call, settings.max_inflight_calls)

    # Deadlines are compared as `now >= start + wait`, the same sums `next_deadline` returns, so a
    # timer that fires at its deadline always finds the queue due (no float round-off spin).
    def round_released(self, now: float, last_activity: float, all_planned: bool) -> bool:
        return all_planned or now >= last_activity + self.batch_window_s

    def can_call(self, inflight_calls: int) -> bool:
        return inflight_calls < self.max_inflight_calls

    def should_dispatch(self, now: float, queued: int, oldest_enqueued: float, released: bool) -> bool:
        return queued > 0 and (
            released or queued >= self.max_requests_per_call or now >= oldest_enqueued + self.max_batch_wait_s
        )

    def batch_size(self, queued: int) -> int:
        return min(queued, self.max_requests_per_call)

    def next_deadline(self, last_activity: float, oldest_enqueued: float | None) -> float | None:
        """When a queue that may call could next become due without any new event (None: never)."""
        if oldest_enqueued is None:
            return None
        return min(last_activity + self.batch_window_s, oldest_enqueued + self.max_batch_wait_s)


def request_group(chain_id: Hashable) -> Hashable:
    """Whose chain this is, for fair sharing: the first part of a (request or prompt id, chain
    index) pair (an HTTP request's `n` chains form one group), else the id itself."""
    return chain_id[0] if isinstance(chain_id, tuple) and chain_id else chain_id


def fair_take(groups: Sequence[Hashable], n: int) -> list[int]:
    """Which `n` of the queued items (given by their groups, oldest first) go into the next call:
    round robin over the groups, in the order of each group's oldest item, oldest first within a
    group. A request that queued thousands of proposals takes its turn with one that queued two,
    instead of filling the calls ahead of it. Returns the chosen indices in queue order."""
    if n >= len(groups):
        return list(range(len(groups)))
    by_group: dict[Hashable, deque[int]] = {}
    for i, group in enumerate(groups):
        by_group.setdefault(group, deque()).append(i)
    chosen: list[int] = []
    while len(chosen) < n:
        for indices in by_group.values():
            if indices and len(chosen) < n:
                chosen.append(indices.popleft())
    return sorted(chosen)


def fair_competitors(groups: Mapping[Hashable, int], group: Hashable) -> int:
    """How many chains one chain of `group` shares the free batch with, for an equal share per
    group split equally among its chains: groups x chains in its group (with equal groups, simply
    every chain)."""
    return len(groups) * groups[group]
