"""The cluster's start waits for its actors, but not for a node that no one will add.

`ray.get(replica.ready.remote())` on a replica that no live node can hold waits forever: Ray keeps
it pending until such a node joins (on KubeRay, the autoscaler may start one; on a fixed cluster,
none comes). `wait_placed` waits as long as the actors are placed or starting (an engine loading
its model takes what it takes), and gives up with `NotPlaced` once a part they belong to has had
no live node offering what it reserves (actors/node_demands.py) for the time limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ray

from actors.node_demands import MissingNodes, NodeDemand
from actors.stage_base import JobFailed

# how often the node table is read while the actors are not ready
CHECK_INTERVAL_S = 1.0


class NotPlaced(JobFailed):
    """No live node could hold a part of the cluster for the time limit (the message is one line):
    the job cannot go on, as every driver that catches JobFailed says."""


def not_placed_message(demand: NodeDemand, waited_s: float, timeout_s: float) -> str:
    return (
        f"cannot place {demand.part}: no live node offers {{{demand.described()}}}, which they reserve "
        f"({demand.settings}), and none joined for {waited_s:.0f} s (ray.missing_node_timeout_s: {timeout_s:g}); "
        "nothing is left running: add such a node or change those settings, then rerun"
    )


def wait_placed(
    refs: Sequence[ray.ObjectRef[Any]],
    demands: Sequence[NodeDemand],
    timeout_s: float | None,
    *,
    clock: Callable[[], float] = time.monotonic,
    read_nodes: Callable[[], Sequence[Mapping[str, Any]]] = ray.nodes,
    interval_s: float = CHECK_INTERVAL_S,
) -> list[Any]:
    """`ray.get(refs)` (the values, in order; a failed start raises its error), raising NotPlaced
    once one of `demands` has had no live node for `timeout_s` (None: wait however long it takes)."""
    if timeout_s is None:
        return ray.get(list(refs))
    watch = MissingNodes(demands, timeout_s)
    waiting = list(refs)
    while waiting:
        done, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=interval_s)
        ray.get(done)  # a start that failed says so now, not after the others
        if waiting and (late := watch.overdue(clock(), read_nodes())) is not None:
            raise NotPlaced(not_placed_message(*late, timeout_s))
    return ray.get(list(refs))
