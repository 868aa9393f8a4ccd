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
waits for room, as Ray Data does (its own `execution_no_progress_timeout_s` bounds that). What
each part reserves, and its clock: actors/node_demands.py (the cluster's start, before the
execution, is bounded by the same limit: actors/placement_wait.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ray
from ray.data._internal.execution.execution_callback import ExecutionCallback

from actors.node_demands import MissingNodes, NodeDemand, replica_demand, stage_demand
from actors.stage_base import JobFailed
from presto_ray.job import JobConfig

# how often the live nodes are read from the GCS while the job runs
CHECK_INTERVAL_S = 1.0


def job_demands(job: JobConfig) -> list[NodeDemand]:
    """What a stage actor and an engine replica of `job` reserve: the parts a lost node can leave
    without a place to run (an empty demand: any live node holds it, so it is never missing)."""
    ray_settings = job.ray
    gpus = job.engine.gpus_per_replica if ray_settings.replica_num_gpus is None else ray_settings.replica_num_gpus
    return [stage_demand(ray_settings), replica_demand(ray_settings, gpus)]


def stop_message(demand: NodeDemand, waited_s: float, timeout_s: float) -> str:
    return (
        f"no live node offers {{{demand.described()}}}, which {demand.part} reserve ({demand.settings}), "
        f"for {waited_s:.0f} s (ray.missing_node_timeout_s: {timeout_s:g}): the job stopped; "
        "the rows written so far are kept; rerun to resume once such a node is back"
    )


class JobNodeWatch(MissingNodes):
    """The job's clock of missing demands: `check(now, nodes)` raises JobFailed once one has been
    missing for `timeout_s`."""

    def check(self, now: float, nodes: Sequence[Mapping[str, Any]]) -> None:
        late = self.overdue(now, nodes)
        if late is not None:
            raise JobFailed(stop_message(*late, self.timeout_s))


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
            self.watch = JobNodeWatch(demands, timeout_s)
            self.next_check = 0.0

        def on_execution_step(self, executor: Any) -> None:
            now = clock()
            if not self.watch.demands or now < self.next_check:
                return
            self.next_check = now + interval_s
            self.watch.check(now, read_nodes())

    return NodeWatch
