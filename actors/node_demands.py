"""What each part of a cluster reserves on a node, and the clock of a part that no live node can hold.

A part (the engine replicas, the coordinators, the job's stage actors) asks Ray for CPUs, GPUs and
custom resources (`ray.placement`); when no live node offers them (the cluster has none such, or
its nodes were lost and none has joined) Ray keeps the part's actors pending, and whoever waits
for them waits with nothing said. Three waits are bounded by `ray.missing_node_timeout_s` with
these helpers: the cluster's start (actors/placement_wait.py), the job's execution
(deployments/node_watch.py) and the service's deploy (deployments/service_runner.py). They read
Ray's node table (`ray.nodes()`); nothing here calls Ray.

A node that offers the resources but is full (other work holds them) is not missing: the part
waits for room. The replicas' placement group (`ray.placement_strategy`) asks more of the nodes:
a STRICT_SPREAD group puts each replica's bundle on a node of its own, so it needs as many live
nodes offering one bundle as there are replicas (`NodeDemand.nodes`), and a STRICT_PACK group puts
them all on one node, which must offer every bundle at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from presto_ray.job import JobConfig
from presto_ray.ray_config import RayConfig


@dataclass(frozen=True)
class NodeDemand:
    """What one actor of a part reserves, and the settings that say so (for the message); `nodes`:
    how many distinct live nodes must each offer it (a STRICT_SPREAD group: one per replica)."""

    part: str  # "the stage actors"
    settings: str  # "ray.placement.chain_actor_resources"
    resources: Mapping[str, float]
    nodes: int = 1
    reserve: str = "they reserve"  # the verb after the part, in the messages ("it reserves": one actor)

    def counts(self) -> bool:
        """Whether any node table can leave it without a place (reserving nothing, one actor: any live node holds it)."""
        return bool(self.resources) or self.nodes > 1

    def holders(self, nodes: Sequence[Mapping[str, Any]]) -> int:
        """How many of `nodes` could hold one such actor (or bundle)."""
        return sum(1 for n in nodes if self.held_by(n))

    def held_by(self, node: Mapping[str, Any]) -> bool:
        """A live node whose total resources can hold one such actor."""
        offered = node.get("Resources") or {}
        return bool(node.get("Alive")) and all(offered.get(name, 0.0) >= amount for name, amount in self.resources.items())

    def described(self) -> str:
        return ", ".join(f"{name}: {amount:g}" for name, amount in sorted(self.resources.items()))


def demand(part: str, settings: str, resources: Mapping[str, float]) -> NodeDemand:
    """A part's demand without the zero amounts (reserving nothing: any live node holds it)."""
    return NodeDemand(part, settings, {k: v for k, v in resources.items() if v > 0})


def stage_demand(ray_settings: RayConfig) -> NodeDemand:
    stage = {"CPU": ray_settings.chain_actor_num_cpus, **ray_settings.placement.chain_actor_resources}
    return demand("the stage actors", "ray.placement.chain_actor_resources, ray.chain_actor_num_cpus", stage)


def replica_demand(ray_settings: RayConfig, gpus_per_replica: float) -> NodeDemand:
    replica = {"CPU": ray_settings.replica_num_cpus, "GPU": gpus_per_replica, **ray_settings.placement.replica_resources}
    return demand("the engine replicas", "ray.placement.replica_resources, ray.replica_num_cpus / num_gpus", replica)


def coordinator_demand(ray_settings: RayConfig) -> NodeDemand:
    return demand("the coordinators", "ray.placement.coordinator_resources", ray_settings.placement.coordinator_resources)


def replica_gpus(ray_settings: RayConfig, engine_gpus: float) -> float:
    """The GPUs one engine replica reserves: `ray.replica_num_gpus`, else the engine's own need."""
    return engine_gpus if ray_settings.replica_num_gpus is None else ray_settings.replica_num_gpus


def replica_bundle(ray_settings: RayConfig, gpus_per_replica: float) -> dict[str, float]:
    """One replica's bundle in the replicas' placement group (an empty bundle cannot be reserved:
    a replica reserving nothing gets a thousandth of a CPU)."""
    wanted = {"CPU": ray_settings.replica_num_cpus, "GPU": gpus_per_replica, **ray_settings.placement.replica_resources}
    return {k: v for k, v in wanted.items() if v > 0} or {"CPU": 0.001}


def replica_group_demand(ray_settings: RayConfig, gpus_per_replica: float) -> NodeDemand:
    """What the replicas' placement group (`ray.placement_strategy`) asks of the nodes: a bundle on
    each of `num_replicas` nodes (STRICT_SPREAD), all bundles on one (STRICT_PACK), or one bundle
    on some node (PACK, SPREAD: soft, the bundles go wherever they fit); without a group, one
    replica's demand."""
    strategy = ray_settings.placement_strategy
    if strategy is None:
        return replica_demand(ray_settings, gpus_per_replica)
    bundle, n = replica_bundle(ray_settings, gpus_per_replica), ray_settings.num_replicas
    settings = f"ray.placement_strategy: {strategy}, ray.num_replicas: {n}, ray.placement.replica_resources, ray.replica_num_cpus / num_gpus"
    if strategy == "STRICT_SPREAD":
        return NodeDemand("the engine replicas", settings, bundle, nodes=n)
    if strategy == "STRICT_PACK":
        return NodeDemand("the engine replicas", settings, {k: v * n for k, v in bundle.items()})
    return NodeDemand("the engine replicas", settings, bundle)


def service_demands(job: JobConfig) -> list[NodeDemand]:
    """What the service's parts reserve (deployments/serve_app.py): the ingress replicas, the
    sampling pool (one actor, on `coordinator_resources`; its coordinators run beside it) and the
    engine replicas the pool starts (their placement group when a strategy is set)."""
    placement = job.ray.placement
    gpus = replica_gpus(job.ray, job.engine.gpus_per_replica)
    return [
        demand("the ingress replicas", "ray.placement.ingress_resources", placement.ingress_resources),
        NodeDemand("the sampling pool", "ray.placement.coordinator_resources", dict(placement.coordinator_resources),
                   reserve="it reserves"),  # fmt: skip
        replica_group_demand(job.ray, gpus),
    ]


def missing(demands: Sequence[NodeDemand], nodes: Sequence[Mapping[str, Any]]) -> list[NodeDemand]:
    """The demands too few live nodes of `nodes` (Ray's node table, `ray.nodes()`) can hold: none,
    or fewer than a STRICT_SPREAD group's replicas."""
    return [d for d in demands if d.counts() and d.holders(nodes) < d.nodes]


class MissingNodes:
    """The clock of each missing demand: `overdue(now, nodes)` names the first one missing for
    `timeout_s` (a node that comes back restarts its clock)."""

    def __init__(self, demands: Sequence[NodeDemand], timeout_s: float) -> None:
        self.demands = [d for d in demands if d.counts()]
        self.timeout_s = timeout_s
        self.since: dict[str, float] = {}  # part -> when it went missing

    def overdue(self, now: float, nodes: Sequence[Mapping[str, Any]]) -> tuple[NodeDemand, float] | None:
        """The first demand missing for the time limit, and for how long; None while none is."""
        absent = missing(self.demands, nodes)
        self.since = {d.part: self.since.get(d.part, now) for d in absent}
        for d in absent:
            if now - self.since[d.part] >= self.timeout_s:
                return d, now - self.since[d.part]
        return None
