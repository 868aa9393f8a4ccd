"""The one owner of the Ray set-up: Ray itself, the replicas' placement group, engine replicas and
the coordinator shards. The batch job, the HTTP service and the Ray bench all start and stop it here.

    cluster = SamplingCluster(config.engine, config.ray).start()
    ... cluster.coordinators.for_prompt(prompt_ids).submit.remote(chain_id, requests) ...
    cluster.shutdown()
"""

from __future__ import annotations

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.coordinator import start_coordinator
from actors.coordinator_shards import CoordinatorShards, shard_replicas
from actors.coordinator_stats import CoordinatorSnapshot
from actors.engine_replica import EngineReplica
from presto_ray.engines import EngineSpec
from presto_ray.ray_config import RaySettings


def ensure_ray(address: str | None = None) -> None:
    """Connect to `address` (or RAY_ADDRESS, as under `ray job submit`), else start a local Ray."""
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=True)


class SamplingCluster:
    """Engine replicas and the coordinator in front of them.

    `replicas`: running replicas to reuse (the cluster leaves them running at shutdown); None
    starts its own. Actor handles are attributes, so tests can kill them mid-job.
    """

    def __init__(
        self, engine_spec: EngineSpec, settings: RaySettings, *, address: str | None = None, replicas: list | None = None
    ) -> None:
        self.engine_spec, self.settings, self.address = engine_spec, settings, address
        self.replicas: list = list(replicas or [])
        self._owns_replicas = not self.replicas
        self.coordinators: CoordinatorShards | None = None
        self._placement_group = None

    @property
    def gpus_per_replica(self) -> float:
        explicit = self.settings.replica_num_gpus
        return self.engine_spec.gpus_per_replica if explicit is None else explicit

    def start(self) -> "SamplingCluster":
        ensure_ray(self.address)
        if not self.replicas:
            self.replicas = self._start_replicas()
        n = len(self.replicas)
        self.coordinators = CoordinatorShards(
            [
                start_coordinator([self.replicas[i] for i in ids], self.settings, ids, n)
                for ids in shard_replicas(n, self.settings.coordinator_shards)
            ],
            self.settings.affinity_tokens,
        )
        return self

    @property
    def coordinator(self):
        """The first coordinator shard (the only one unless `ray.coordinator_shards` > 1)."""
        return self.coordinators.handles[0] if self.coordinators else None

    def snapshot(self) -> CoordinatorSnapshot:
        return self.coordinators.snapshot_blocking()

    def shutdown(self) -> None:
        owned = self.replicas if self._owns_replicas else []
        for replica in owned:
            try:
                ray.get(replica.shutdown.remote(), timeout=60)
            except Exception:  # already dead: nothing to free
                pass
        for actor in [*(self.coordinators.handles if self.coordinators else []), *owned]:
            ray.kill(actor, no_restart=True)
        if self._placement_group is not None:
            ray.util.remove_placement_group(self._placement_group)
        self.coordinators, self._placement_group = None, None
        self.replicas = [] if self._owns_replicas else self.replicas

    def __enter__(self) -> "SamplingCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def _start_replicas(self) -> list:
        """`num_replicas` replica actors, in one placement group when a strategy is configured."""
        s = self.settings
        cpus, gpus = s.replica_num_cpus, self.gpus_per_replica
        options = dict(
            num_cpus=cpus,
            num_gpus=gpus,
            max_restarts=s.replica_max_restarts,
            max_concurrency=max(8, 2 * s.max_inflight_calls),
        )
        if s.placement_strategy:
            bundle = {k: v for k, v in {"CPU": cpus, "GPU": gpus}.items() if v > 0} or {"CPU": 0.001}
            self._placement_group = ray.util.placement_group([bundle] * s.num_replicas, strategy=s.placement_strategy)
            ray.get(self._placement_group.ready())
        remote = ray.remote(EngineReplica)
        replicas = []
        for i in range(s.num_replicas):
            opts = dict(options)
            if self._placement_group is not None:
                opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    self._placement_group, placement_group_bundle_index=i
                )
                if not cpus and not gpus:  # an empty bundle cannot be reserved
                    opts["num_cpus"] = 0.001
            replicas.append(remote.options(**opts).remote(self.engine_spec, i))
        ray.get([r.ready.remote() for r in replicas])
        return replicas
