"""Runs the engine pool's autoscaling rule (actors/autoscaling_policy.py) against a SamplingCluster:
reads the coordinators' load, starts replicas, retires some and stops them once drained.

Engine replicas stay plain Ray actors rather than Serve replicas because the coordinator must address
each one itself (prefix affinity, one merged call per replica, per-replica event streams, failover)
and a Serve handle's router hides which replica answers; the knobs are Serve's all the same."""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from actors.autoscaling_policy import ReplicaScalingPolicy
from actors.coordinator_stats import CoordinatorSnapshot
from presto_ray.ray_config import ReplicaAutoscalingConfig

log = logging.getLogger(__name__)


class ReplicaPool(Protocol):
    """What the autoscaler drives: a SamplingCluster (actors/cluster.py)."""

    @property
    def active_replicas(self) -> list[int]: ...

    @property
    def pending_replicas(self) -> list[int]: ...

    def snapshot(self) -> CoordinatorSnapshot: ...

    def add_replica(self) -> int: ...

    def join_placed(self, timeout_s: float = 0.0) -> list[int]: ...

    def cancel_pending(self) -> int | None: ...

    def retire_replica(self) -> int: ...

    def stop_drained(self) -> list[int]: ...

    def resync_shards(self) -> int: ...


class ReplicaAutoscaler:
    """`step(now)` is one pass (tests drive it with their own clock); `start()` runs a pass every
    `interval_s` on a daemon thread until `stop()`."""

    def __init__(self, cluster: ReplicaPool, scaling: ReplicaAutoscalingConfig) -> None:
        self.cluster, self.scaling = cluster, scaling
        self.policy = ReplicaScalingPolicy(scaling)
        self.started_replicas: list[int] = []  # asked for
        self.joined_replicas: list[int] = []  # started and handed to their shard
        self.stopped_replicas: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self, now: float) -> int:
        """Stop what has drained, hand the replicas started since to their shards, read the load,
        act on the rule; the replica count after (active and pending). Never waits for a replica
        to start: one asked for joins at the first pass after it is ready (until then it counts,
        so it is not asked for twice), and one the load no longer wants is cancelled first."""
        self.cluster.resync_shards()
        self.stopped_replicas += self.cluster.stop_drained()
        self.joined_replicas += self.cluster.join_placed()
        current = len(self.cluster.active_replicas) + len(self.cluster.pending_replicas)
        target = self.policy.decide(now, current, self.cluster.snapshot().ongoing_requests)
        for _ in range(target - current):
            self.started_replicas.append(self.cluster.add_replica())
        for _ in range(current - target):
            if self.cluster.cancel_pending() is None:
                self.cluster.retire_replica()
        if target != current:
            log.info("engine replicas: %d -> %d", current, target)
        return target

    def start(self) -> "ReplicaAutoscaler":
        self._thread = threading.Thread(target=self._run, name="presto-replica-autoscaler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)

    def _run(self) -> None:
        while not self._stop.wait(self.scaling.interval_s):
            try:
                self.step(time.monotonic())
            except Exception:  # a failed pass (a replica that would not start) is tried again next time
                log.exception("engine autoscaling pass failed")
