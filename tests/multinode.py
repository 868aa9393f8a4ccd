"""A Ray cluster of several nodes on this one machine, for the multi-node tests (issue 33).

Ray's own `ray.cluster_utils.Cluster`: a head and worker nodes, each its own raylet with its own
object store and its own custom resources, which say what the node is for (as a GPU says so on a
real cluster): `presto_engine` (engine replicas), `presto_chains` (the job's stage actors),
`presto_coordinator` (the coordinator, and the Serve pool that owns it), `presto_ingress` (Serve's
HTTP ingress). The head holds the GCS, the drivers and Serve's one HTTP proxy, as a KubeRay head
does; it is never lost (losing it loses the cluster, here as there).

`lose(node)` is a node's loss, not a polite removal: its raylet, its agents and every worker it
started (the actors on it) are SIGKILLed at once; the GCS marks it dead after its health checks
fail (set to about a second here: Ray's default is 15 s). This process stays out of the cluster
(the jobs and the service run in driver processes of their own), so the session's local Ray
(conftest's `ray_address`) and this one never meet. The head does not write
/tmp/ray/ray_current_cluster (where Ray's `ray.init()` would find it): other Ray users of this
machine must not join it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

ENGINE, CHAINS, COORDINATOR, INGRESS = "presto_engine", "presto_chains", "presto_coordinator", "presto_ingress"

# every node's object store (Ray's floor is 75 MiB); the toy's objects are small
OBJECT_STORE_BYTES = 80 * 1024 * 1024
# how long a new node may take to register (cluster_utils' own 30 s was too short once, at load 12)
NODE_START_TIMEOUT_S = 120.0
# a lost node is declared dead after about `period x threshold` of failed health checks
FAST_FAILURE_DETECTION = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 2,
}


def driver_env(address: str) -> dict[str, str]:
    """The environment of a driver process (a `presto-ray` command) on this cluster."""
    env = {**os.environ, "RAY_ADDRESS": address, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO)}
    return env


@contextmanager
def _node_environment() -> Iterator[None]:
    """What every node's processes inherit: the project on the path, no token auth, and Serve's
    proxy callback (deployments/proxy_callback.py) for the head's proxy."""
    from deployments.proxy_callback import PROXY_CALLBACK, PROXY_CALLBACK_ENV

    wanted = {"PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled", PROXY_CALLBACK_ENV: PROXY_CALLBACK}
    saved = {k: os.environ.get(k) for k in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class LocalCluster:
    """A head (2 CPUs for Ray Data's read and write tasks, the drivers' node) and worker nodes
    added by role (no CPU: only what reserves their resource runs there)."""

    def __init__(self) -> None:
        import ray._private.utils as ray_utils
        from ray.cluster_utils import Cluster

        self.roles: dict[str, str] = {}  # node id -> role
        self._pids: set[int] = set()
        write_address = ray_utils.write_ray_address
        ray_utils.write_ray_address = lambda *args, **kwargs: None  # not /tmp/ray/ray_current_cluster
        try:
            with _node_environment():
                self.cluster = Cluster(
                    initialize_head=True,
                    head_node_args=dict(
                        wait=False, num_cpus=2, include_dashboard=False, object_store_memory=OBJECT_STORE_BYTES,
                        _system_config=FAST_FAILURE_DETECTION,
                    ),
                )  # fmt: skip
                self.cluster._wait_for_node(self.cluster.head_node, timeout=NODE_START_TIMEOUT_S)
        finally:
            ray_utils.write_ray_address = write_address
        self.head = self.cluster.head_node
        self.roles[self.head.node_id] = "head"
        self._remember(self.head)

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def add_node(self, role: str, units: float = 1.0) -> Any:
        """A worker node offering `units` of `role`'s resource; its `ray._private.node.Node` once
        the GCS lists it."""
        with _node_environment():
            node = self.cluster.add_node(
                wait=False, num_cpus=0, resources={role: units}, object_store_memory=OBJECT_STORE_BYTES
            )
            self.cluster._wait_for_node(node, timeout=NODE_START_TIMEOUT_S)
        self.roles[node.node_id] = role
        self._remember(node)
        return node

    def lose(self, node: Any) -> float:
        """SIGKILL the node's raylet, agents and workers at once; the monotonic time of the kill."""
        from presto_ray.process_watchdog import process_tree

        own = [info.process.pid for infos in node.all_processes.values() for info in infos]
        victims = [*own, *process_tree(*own)]
        killed_at = time.monotonic()
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.cluster.remove_node(node, allow_graceful=False)  # waits for (reaps) its own processes
        return killed_at

    def remove(self, node: Any) -> None:
        """Take a node out politely (drained and unregistered), as a scale-down would."""
        self.processes()  # its workers, to check they exit too
        self.cluster.remove_node(node, allow_graceful=True)

    def alive_nodes(self) -> set[str]:
        return {n["NodeID"] for n in self.cluster.global_state.node_table() if n["Alive"]}

    def actors(self, class_name: str, state: str = "ALIVE") -> list[dict[str, Any]]:
        """The cluster's actors of one class, or Ray Data's workers of that stage class
        (`MapWorker(MapBatches(PowerSamplingStage))`), from Ray's actor table (NodeID, Pid, ...)."""
        table = self.cluster.global_state.actor_table(None)
        return [
            {**a, "NodeID": a["Address"]["NodeID"]} for a in table.values()
            if a["State"] == state and (a["ActorClassName"] == class_name or f"({class_name})" in a["ActorClassName"])
        ]  # fmt: skip

    def actor_classes(self) -> list[str]:
        """The classes of the cluster's live actors (for messages)."""
        return sorted(a["ActorClassName"] for a in self.cluster.global_state.actor_table(None).values() if a["State"] == "ALIVE")

    def nodes_of(self, class_name: str) -> set[str]:
        """The nodes running an actor of this class now."""
        return {a["NodeID"] for a in self.actors(class_name)}

    def node(self, node_id: str) -> Any:
        for node in self.cluster.worker_nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no worker node {node_id} (the head is never lost)")

    def processes(self) -> set[int]:
        """Every process this cluster started that is still alive (nodes' services and workers)."""
        from presto_ray.process_watchdog import process_tree, start_time

        for node in self.cluster.list_all_nodes():
            self._remember(node)
        return {pid for pid in self._pids if start_time(pid) is not None}

    def _remember(self, node: Any) -> None:
        from presto_ray.process_watchdog import process_tree

        own = [info.process.pid for infos in node.all_processes.values() for info in infos]
        self._pids.update(own, process_tree(*own))

    def shutdown(self) -> set[int]:
        """Stop every node; the pids of this cluster's processes still alive after (none, if all is well)."""
        from waiting import wait_for

        self.processes()  # the workers started since: they exit with their raylets
        self.cluster.shutdown()
        try:
            wait_for(lambda: not self.processes(), 30, "the cluster's processes to exit", interval_s=0.2)
        except AssertionError:
            pass
        left = self.processes()
        for pid in left:  # reported (a defect), and not left running
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return left
