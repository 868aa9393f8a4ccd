"""A job whose parts have no node left to run on stops in one line, after `ray.missing_node_timeout_s`.

When the last node that can hold a part of the job is lost (the stage actors' nodes, offering
`ray.placement.chain_actor_resources`; the engine replicas', offering `replica_resources` and the
replicas' GPUs), Ray keeps the part's actors pending until a node that can hold them joins, and
Ray Data waits for its actor pool: the job waits with nothing said (measured: still waiting 150 s
after the loss). On KubeRay a replacement pod ends the wait; when none comes, the job should not
wait forever. So while the job's dataset executes, `node_watch` (a Ray Data execution callback:
`DataContext.custom_execution_callback_classes`, called at every step of the executor's scheduling
loop) reads the live nodes from the GCS (`ray.nodes()`) at most once a second, and once no live
node has offered what a part reserves for the time limit, raises `JobFailed` out of the executor's
loop: Ray Data ends the execution (its actors are killed), the driver says one line and exits 1,
and the files committed so far stay for the rerun to resume from. The coordinator has its own
bound (`ray.coordinator_restart_timeout_s`, in the stage), so it is not watched here.

A node that offers the resources but is full (other work holds them) is not missing: the part
waits for room, as Ray Data does (its own `execution_no_progress_timeout_s` bounds that).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.data._internal.execution.execution_callback import ExecutionCallback

from actors.stage_base import JobFailed
from presto_ray.job import JobConfig

# how often the live nodes are read from the GCS while the job runs
CHECK_INTERVAL_S = 1.0


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


def job_demands(job: JobConfig) -> list[NodeDemand]:
    """What a stage actor and an engine replica of `job` reserve: the parts a lost node can leave
    without a place to run (an empty demand: any live node holds it, so it is never missing)."""
    ray_settings = job.ray
    gpus = job.engine.gpus_per_replica if ray_settings.replica_num_gpus is None else ray_settings.replica_num_gpus
    stage = {"CPU": ray_settings.chain_actor_num_cpus, **ray_settings.placement.chain_actor_resources}
    replica = {"CPU": ray_settings.replica_num_cpus, "GPU": gpus, **ray_settings.placement.replica_resources}
    demands = [
        NodeDemand("the stage actors", "ray.placement.chain_actor_resources, ray.chain_actor_num_cpus", stage),
        NodeDemand("the engine replicas", "ray.placement.replica_resources, ray.replica_num_cpus / num_gpus", replica),
    ]
    return [NodeDemand(d.part, d.settings, {k: v for k, v in d.resources.items() if v > 0}) for d in demands]


def missing(demands: Sequence[NodeDemand], nodes: Sequence[Mapping[str, Any]]) -> list[NodeDemand]:
    """The demands no live node of `nodes` (Ray's node table, `ray.nodes()`) can hold."""
    return [d for d in demands if d.resources and not any(d.held_by(n) for n in nodes)]


def stop_message(demand: NodeDemand, waited_s: float, timeout_s: float) -> str:
    return (
        f"no live node offers {{{demand.described()}}}, which {demand.part} reserve ({demand.settings}), "
        f"for {waited_s:.0f} s (ray.missing_node_timeout_s: {timeout_s:g}): the job stopped; "
        "the rows written so far are kept; rerun to resume once such a node is back"
    )


class MissingNodes:
    """The clock of each missing demand: `check(now, nodes)` raises JobFailed once one has been
    missing for `timeout_s` (a node that comes back restarts its clock)."""

    def __init__(self, demands: Sequence[NodeDemand], timeout_s: float) -> None:
        self.demands = [d for d in demands if d.resources]
        self.timeout_s = timeout_s
        self.since: dict[str, float] = {}  # part -> when it went missing

    def check(self, now: float, nodes: Sequence[Mapping[str, Any]]) -> None:
        absent = missing(self.demands, nodes)
        self.since = {d.part: self.since.get(d.part, now) for d in absent}
        for demand in absent:
            if now - self.since[demand.part] >= self.timeout_s:
                raise JobFailed(stop_message(demand, now - self.since[demand.part], self.timeout_s))


def node_watch(
    demands: Sequence[NodeDemand],
    timeout_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    read_nodes: Callable[[], Sequence[Mapping[str, Any]]] = ray.nodes,
    interval_s: float = CHECK_INTERVAL_S,
) -> type[ExecutionCallback]:
    """The execution callback class for one job (Ray Data builds one per execution from its class)."""

    class NodeWatch(ExecutionCallback):
        def __init__(self) -> None:
            self.watch = MissingNodes(demands, timeout_s)
            self.next_check = 0.0

        def on_execution_step(self, executor: Any) -> None:
            now = clock()
            if not self.watch.demands or now < self.next_check:
                return
            self.next_check = now + interval_s
            self.watch.check(now, read_nodes())

    return NodeWatch
