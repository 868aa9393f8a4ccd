"""The sampling pool: the engine replicas and coordinator shards of one Serve application.

One replica (serve_app.py makes it a Serve deployment). The engine replicas are Ray actors the
pool owns rather than Serve replicas because the coordinator addresses each one (prefix affinity,
per-replica event streams, failover), which a Serve handle's routing hides; they die with the pool.
Or the caller passes engine replicas it started and owns (`app_for(config, replicas=...)`: engines
shared with other work on the cluster); the pool then neither autoscales nor stops them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from actors.cluster import SamplingCluster
from actors.coordinator_shards import CoordinatorShards
from actors.engine_replica import ReplicaHandle
from presto_ray.job import JobConfig


class SamplingPool:
    """The engine replicas and coordinator shards of one application (Ray restarts what dies
    inside it, and the actors it owns die with it), and the service-wide count of clients that
    left (every ingress replica reports here)."""

    def __init__(self, config: dict[str, Any], replicas: Sequence[ReplicaHandle] | None = None) -> None:
        job = JobConfig.model_validate(config)  # a JobConfig as JSON: what Serve passes
        # started: replicas ready (or the caller's), coordinators up on this node (the pool took
        # ray.placement.coordinator_resources)
        self.cluster = SamplingCluster(job.engine, job.ray, replicas=replicas, coordinators_here=True)
        self.client_disconnects = 0

    def count_disconnect(self) -> None:
        self.client_disconnects += 1

    def disconnects(self) -> int:
        return self.client_disconnects

    def pending_replicas(self) -> int:
        """Engine replicas asked for and not started yet (waiting for a node that can hold them)."""
        return len(self.cluster.pending_replicas)

    def coordinators(self) -> CoordinatorShards:
        return self.cluster.coordinators

    def __del__(self) -> None:  # Serve calls it when the application goes: free the engines
        try:
            self.cluster.shutdown()
        except Exception:  # already half gone: nothing more to free
            pass
