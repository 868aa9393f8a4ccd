"""What each part of a cluster reserves on a node, and the clock of a part that no live node can hold.

A part (the engine replicas, the coordinators, the job's stage actors) asks Ray for CPUs, GPUs and
custom resources (`ray.placement`); when no live node offers them (the cluster has none such, or
its nodes were lost and none has joined) Ray keeps the part's actors pending, and whoever waits
for them waits with nothing said. Two waits are bounded by `ray.missing_node_timeout_s` with these
helpers: the cluster's start (actors/placement_wait.py) and the job's execution
(deployments/node_watch.py). They read Ray's node table (`ray.nodes()`); nothing here calls Ray.

A node that offers the resources but is full (other work holds them) is not missing: the part
waits for room. Neither is one of too few nodes for a STRICT_SPREAD placement group (each node
offers what one bundle asks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from presto_ray.ray_config import RayConfig


@dataclass(frozen=True)
class NodeDemand:
    """What one actor of a part reserves, and the settings that say so (for the message)."""

    part: str  # "the stage actors"
    settings: str  # "ray.placement.chain_actor_resources"
    resources: Mapping[str, float]

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


def missing(demands: Sequence[NodeDemand], nodes: Sequence[Mapping[str, Any]]) -> list[NodeDemand]:
    """The demands no live node of `nodes` (Ray's node table, `ray.nodes()`) can hold."""
    return [d for d in demands if d.resources and not any(d.held_by(n) for n in nodes)]


class MissingNodes:
    """The clock of each missing demand: `overdue(now, nodes)` names the first one missing for
    `timeout_s` (a node that comes back restarts its clock)."""

    def __init__(self, demands: Sequence[NodeDemand], timeout_s: float) -> None:
        self.demands = [d for d in demands if d.resources]
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
