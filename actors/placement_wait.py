"""The cluster's start waits for its actors, but not for a node that no one will add.

`ray.get(replica.ready.remote())` on a replica that no live node can hold waits forever: Ray keeps
it pending until such a node joins (on KubeRay, the autoscaler may start one; on a fixed cluster,
none comes). `wait_placed` waits as long as the actors are placed or starting (an engine loading
its model takes what it takes), and gives up with `NotPlaced` once a part they belong to has had
no live node offering what it reserves (actors/node_demands.py) for the time limit, or, for the
replicas' STRICT_SPREAD placement group, fewer such nodes than replicas (each needs a node of its
own: Ray keeps the group pending, and `group.ready()` waits, until enough join).
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


def not_placed_message(demand: NodeDemand, waited_s: float, timeout_s: float, holders: int = 0) -> str:
    """The one line; `holders`: the live nodes that could hold one of a demand that needs several
    (`demand.nodes`, a STRICT_SPREAD group's replicas)."""
    limit = f"for {waited_s:.0f} s (ray.missing_node_timeout_s: {timeout_s:g}); nothing is left running"
    if demand.nodes > 1:
        offer = f"{holders} live node{'' if holders == 1 else 's'} offer{'s' if holders == 1 else ''}"
        return (
            f"cannot place {demand.part}: each of the {demand.nodes} needs a node of its own, and {offer} "
            f"{{{demand.described()}}}, which each reserves ({demand.settings}); no more joined {limit}: "
            "add nodes or change those settings, then rerun"
        )
    return (
        f"cannot place {demand.part}: no live node offers {{{demand.described()}}}, which {demand.reserve} "
        f"({demand.settings}), and none joined {limit}: add such a node or change those settings, then rerun"
    )


def overdue_message(watch: MissingNodes, now: float, nodes: Sequence[Mapping[str, Any]]) -> str | None:
    """The one line once a demand of `watch` has been missing from `nodes` for its limit; None before."""
    late = watch.overdue(now, nodes)
    if late is None:
        return None
    demand, waited_s = late
    return not_placed_message(demand, waited_s, watch.timeout_s, demand.holders(nodes))


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
        if waiting and (message := overdue_message(watch, clock(), read_nodes())) is not None:
            raise NotPlaced(message)
    return ray.get(list(refs))
