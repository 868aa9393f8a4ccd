"""The one owner of the Ray set-up: Ray itself, the replicas' placement group, engine replicas and
the coordinator shards. The batch job, the HTTP service and the Ray bench all start and stop it here.

    cluster = SamplingCluster(config.engine, config.ray)   # started: replicas ready, coordinators up
    ... cluster.coordinators.for_prompt(prompt_ids).submit.remote(chain_id, requests) ...
    cluster.shutdown()

or `with SamplingCluster(config.engine, config.ray) as cluster: ...`, which shuts it down on leaving.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any

import ray
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from actors.coordinator import CoordinatorHandle, start_coordinator
from actors.coordinator_shards import CoordinatorShards, shard_replicas
from actors.coordinator_stats import CoordinatorSnapshot
from actors.engine_replica import EngineReplica, ReplicaHandle
from actors.handles import kill_actor
from actors.node_demands import NodeDemand, coordinator_demand, replica_bundle, replica_demand, replica_gpus, replica_group_demand
from actors.placement_wait import wait_placed
from actors.replica_autoscaler import ReplicaAutoscaler
from presto_ray import process_watchdog
from presto_ray.engines import EngineConfig
from presto_ray.ray_config import RayConfig

if TYPE_CHECKING:
    from ray._private.node import Node

log = logging.getLogger(__name__)


def ensure_ray(address: str | None = None, quiet: bool = False) -> None:
    """Connect to `address` (or RAY_ADDRESS, as under `ray job submit`), else start a local Ray;
    `quiet`: without Ray's INFO lines (which cluster it started or joined).

    A local Ray started here is watched: Ray's own processes die with a driver that exits, but
    some (its dashboard and runtime-env agents) outlive a SIGKILLed one. A small watchdog process
    (presto_ray/process_watchdog.py, its own session, no Ray import) keeps a record of the
    driver's process tree and stops what is left of it once the driver is gone; should the
    watchdog be killed too, the next local start stops them from the record it left in
    `LOCAL_RAY_RECORDS` (and says so on stderr)."""
    if not ray.is_initialized():
        local = address is None and not os.environ.get("RAY_ADDRESS") and sys.platform.startswith("linux")
        if local:
            process_watchdog.reap_left_behind(LOCAL_RAY_RECORDS, "Ray")
        ray.init(address=address, log_to_driver=True, logging_level=logging.WARNING if quiet else logging.INFO)
        if local:
            process_watchdog.start_watchdog(LOCAL_RAY_RECORDS, session=_session_dir())


# Records of local Ray processes, one per driver that started a local Ray, for its watchdog.
LOCAL_RAY_RECORDS = process_watchdog.records_folder("local-ray")


def _session_dir() -> str | None:
    node: Node | None = ray._private.worker._global_node  # this process's Ray node, once ray.init ran
    try:
        return None if node is None else node.get_session_dir_path()
    except Exception:
        return None


RESTART_ARGS_WARNING = b"ray-project/ray/issues/53727"


@contextmanager
def _without_restart_args_warning() -> Iterator[None]:
    """Ray's core worker logs an ERROR line (core_worker.cc, once per process, on stderr) when an
    actor with max_restarts > 0 gets an ObjectRef in its constructor arguments: the coordinator
    gets its replicas' actor handles, each carrying its actor's ref (ray-project/ray#53727: a
    restart fails if those refs are gone). They are not: this cluster holds the replicas for the
    coordinator's whole life, and a restarted coordinator finds them (tests kill it). So that
    line, written to descriptor 2 while the coordinators are created, is dropped; everything
    else written there meanwhile is passed on. With `ray.coordinator_max_restarts: 0` the line
    comes instead from Ray Data's stage actors (restarted by Ray Data, given the coordinators'
    handles), once, mid-job. Avoiding it at its cause would mean passing handles by name: the
    replicas to the coordinator (actors/coordinator.py), the coordinators to the stage."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().splitlines(keepends=True) if RESTART_ARGS_WARNING not in line]
            if kept:
                os.write(2, b"".join(kept))


def coordinator_placement(settings: RayConfig, beside_this_process: bool = False) -> dict[str, Any]:
    """Ray's options placing a coordinator shard: the custom resources of
    `ray.placement.coordinator_resources`, else the node of this process, softly (a restart after
    that node is lost goes wherever Ray finds room). Its owner is this process either way: the
    coordinator dies with it, so this node is the one whose loss costs nothing more.

    `beside_this_process` (the Serve pool, which reserved those resources itself): this node and
    no other. Softly, Ray once placed a pool's new shard on an engine node (the suite, 2026-12-03:
    the pool's node passed the lease on), whose loss then failed every request through it; the
    pool and its coordinators share a node's fate anyway (its loss ends the pool, their owner)."""
    wanted = settings.placement.coordinator_resources
    if wanted and not beside_this_process:
        return {"resources": dict(wanted)}
    here = ray.get_runtime_context().get_node_id()
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(here, soft=not beside_this_process)}


class SamplingCluster:
    """Engine replicas and the coordinator shards in front of them, started when constructed: Ray
    connected (or started, see `ensure_ray`), every replica ready, the coordinators up and, with
    `ray.replica_autoscaling`, the autoscaler running. `shutdown()` (or leaving a `with` block)
    stops what it started.

    `replicas`: running replicas to reuse (the cluster leaves them running at shutdown); None
    starts its own. `coordinators_here`: the coordinators run on this process's node (the Serve
    pool, placed by `ray.placement.coordinator_resources` itself) instead of reserving those
    resources again. `placement_timeout_s`: the start gives up (`NotPlaced`, actors/placement_wait.py:
    one line naming the part and its settings) once the replicas or the coordinators have had no
    live node that can hold them for this long, stopping what it started; None: it waits for such
    a node however long it takes. Actor handles are attributes, so tests can kill them mid-job.
    """

    def __init__(
        self,
        engine_spec: EngineConfig,
        settings: RayConfig,
        *,
        address: str | None = None,
        replicas: Sequence[ReplicaHandle] | None = None,
        coordinators_here: bool = False,
        placement_timeout_s: float | None = None,
    ) -> None:
        self.engine_spec, self.settings, self.address = engine_spec, settings, address
        self.placement_timeout_s = placement_timeout_s
        self._owns_replicas = not replicas
        self._placement_group: PlacementGroup | None = None
        self.draining: set[int] = set()  # retired by the autoscaler, still finishing their work
        self.stopped: set[int] = set()  # retired and stopped (their slots stay: indices never move)
        self.pending: dict[int, ray.ObjectRef] = {}  # added, not yet ready: index -> its `ready` call
        self._shut_down = False
        self.autoscaler: ReplicaAutoscaler | None = None
        self.replicas: list[ReplicaHandle] = list(replicas) if replicas else []
        self._shards: list[CoordinatorHandle] = []  # started so far (what a failed start stops)
        ensure_ray(address)
        try:
            if not replicas:
                self._start_replicas()
            n = len(self.replicas)
            with _without_restart_args_warning():
                self._shards = [start_coordinator([self.replicas[i] for i in ids], settings, ids, n, coordinator_placement(settings, coordinators_here))
                                for ids in shard_replicas(n, settings.coordinator_shards)]  # fmt: skip
            # placed and answering before any chain calls them (a chain's call would wait for a node)
            demands = [] if coordinators_here else [coordinator_demand(settings)]
            self._wait_placed([shard.replica_indices.remote() for shard in self._shards], demands)
        except BaseException:
            self.shutdown()
            raise
        self.coordinators = CoordinatorShards(self._shards, settings.affinity_tokens)
        if settings.replica_autoscaling is not None and self._owns_replicas:
            self.autoscaler = ReplicaAutoscaler(self, settings.replica_autoscaling).start()

    @property
    def gpus_per_replica(self) -> float:
        return replica_gpus(self.settings, self.engine_spec.gpus_per_replica)

    # --- the pool grows and shrinks (driven by actors/replica_autoscaler.py) ----------------------
    @property
    def active_replicas(self) -> list[int]:
        """Indices of the replicas taking new work (started and handed to their shard)."""
        return [i for i in range(len(self.replicas)) if i not in self.draining and i not in self.stopped and i not in self.pending]

    @property
    def pending_replicas(self) -> list[int]:
        """Indices of the replicas added and not yet started (waiting for a node that can hold
        them, or starting their engine): `join_placed` hands them to their shard once ready."""
        return sorted(self.pending)

    def _shard_of(self, i: int) -> CoordinatorHandle:
        # shard_replicas' partition (replica i to shard i mod shards), which holds as replicas are
        # added because there are never fewer replicas than shards when autoscaling
        return self.coordinators.handles[i % len(self.coordinators)]

    def add_replica(self) -> int:
        """Ask for one more engine replica; its index, at once. It is pending until Ray has placed
        it (a node that can hold it may not exist yet: on KubeRay the demand starts one) and its
        engine is ready; `join_placed` then hands it to its coordinator shard. Meanwhile the
        coordinators serve with the replicas they have."""
        i = len(self.replicas)
        replica = ray.remote(EngineReplica).options(**self._replica_options()).remote(self.engine_spec, i)
        self.replicas.append(replica)
        self.pending[i] = replica.ready.remote()
        return i

    def join_placed(self, timeout_s: float = 0.0) -> list[int]:
        """Hand each pending replica that is ready (waiting up to `timeout_s` for all of them) to
        its coordinator shard; their indices. A replica whose start failed is stopped (logged): the
        autoscaler asks for another if the load still wants it."""
        if not self.pending:
            return []
        ready, _ = ray.wait(list(self.pending.values()), num_returns=len(self.pending), timeout=timeout_s)
        done = {ref.hex() for ref in ready}
        joined: list[int] = []
        for i in [i for i, ref in self.pending.items() if ref.hex() in done]:
            ref = self.pending.pop(i)
            try:
                ray.get(ref)
            except Exception:
                log.exception("engine replica %d failed to start", i)
                kill_actor(self.replicas[i])
                self.stopped.add(i)
                continue
            ray.get(self._shard_of(i).add_replica.remote(self.replicas[i], i))
            joined.append(i)
        return joined

    def cancel_pending(self) -> int | None:
        """Stop the newest pending replica (the load no longer wants it); its index, or None."""
        if not self.pending:
            return None
        i = max(self.pending)
        del self.pending[i]
        kill_actor(self.replicas[i])
        self.stopped.add(i)
        return i

    def retire_replica(self) -> int:
        """Stop giving the newest active replica work; `stop_drained` stops it once its work ended."""
        i = self.active_replicas[-1]
        ray.get(self._shard_of(i).retire_replica.remote(i))
        self.draining.add(i)
        return i

    def stop_drained(self) -> list[int]:
        """Stop the retiring replicas whose calls and streams have all ended; their indices."""
        stopped: list[int] = []
        for i in sorted(self.draining):
            shard = self._shard_of(i)
            if not ray.get(shard.replica_drained.remote(i)):
                continue
            ray.get(shard.forget_replica.remote(i))
            self._stop_replica(self.replicas[i])
            self.draining.discard(i)
            self.stopped.add(i)
            stopped.append(i)
        return stopped

    def resync_shards(self) -> int:
        """Hand a coordinator that Ray restarted (it comes back with the replicas it was started
        with) the replicas added since, and retire again those retiring; how many it was missing."""
        missing = 0
        handles = self.coordinators.handles
        known_by_shard = ray.get([shard.replica_indices.remote() for shard in handles])  # one round trip for all
        for s, (shard, known) in enumerate(zip(handles, map(set, known_by_shard))):
            for i in range(s, len(self.replicas), len(self.coordinators)):
                if i in known or i in self.stopped or i in self.pending:
                    continue
                ray.get(shard.add_replica.remote(self.replicas[i], i))
                if i in self.draining:
                    ray.get(shard.retire_replica.remote(i))
                missing += 1
        return missing

    @staticmethod
    def _stop_replica(replica: ReplicaHandle) -> None:
        try:
            ray.get(replica.shutdown.remote(), timeout=60)
        except Exception:  # already dead: nothing to free
            pass
        kill_actor(replica)

    @property
    def coordinator(self) -> CoordinatorHandle:
        """The first coordinator shard (the only one unless `ray.coordinator_shards` > 1)."""
        return self.coordinators.handles[0]

    def snapshot(self, lost_ok: bool = False) -> CoordinatorSnapshot:
        return self.coordinators.snapshot_blocking(lost_ok=lost_ok)

    def shutdown(self) -> None:
        """Stop the autoscaler, the coordinators, the replicas it started and their placement
        group; once (a second call does nothing)."""
        if self._shut_down:
            return
        self._shut_down = True
        if self.autoscaler is not None:
            self.autoscaler.stop()
            self.autoscaler = None
        for actor in self._shards:
            kill_actor(actor)
        if self._owns_replicas:
            for i, replica in enumerate(self.replicas):
                if i in self.pending:  # not started: nothing to shut down (asking it would wait for a node)
                    kill_actor(replica)
                elif i not in self.stopped:
                    self._stop_replica(replica)
            self.pending.clear()
        if self._placement_group is not None:
            ray.util.remove_placement_group(self._placement_group)
        self._placement_group = None
        self.replicas = [] if self._owns_replicas else self.replicas

    def __enter__(self) -> SamplingCluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.shutdown()

    def _replica_options(self) -> dict[str, Any]:
        """Ray's options for one replica outside a placement group: its CPUs, GPUs and custom
        resources (`ray.placement.replica_resources`), SPREAD over the nodes that can hold it."""
        s = self.settings
        options: dict[str, Any] = dict(
            num_cpus=s.replica_num_cpus,
            num_gpus=self.gpus_per_replica,
            max_restarts=s.replica_max_restarts,
            max_concurrency=max(8, 2 * s.max_inflight_calls),
        )
        if s.placement.replica_resources:
            options["resources"] = dict(s.placement.replica_resources)
        if s.placement.spread_replicas:
            options["scheduling_strategy"] = "SPREAD"
        return options

    def _wait_placed(self, refs: Sequence[ray.ObjectRef[Any]], demands: Sequence[NodeDemand]) -> None:
        wait_placed(refs, demands, self.placement_timeout_s)

    def _start_replicas(self) -> None:
        """The first replica actors (`num_replicas`, or the autoscaler's `min_replicas`), in one
        placement group when a strategy is configured; pending until all are ready, so that a
        start that gives up kills them without asking them to shut down."""
        s = self.settings
        cpus, gpus = s.replica_num_cpus, self.gpus_per_replica
        options = self._replica_options()
        if s.placement_strategy:
            bundle = replica_bundle(s, gpus)
            group = ray.util.placement_group([bundle] * s.num_replicas, strategy=s.placement_strategy)
            self._placement_group = group
            # the group's own demand: a STRICT_SPREAD group needs num_replicas such nodes, a STRICT_PACK one all on one
            self._wait_placed([group.ready()], [replica_group_demand(s, gpus)])
        remote = ray.remote(EngineReplica)
        for i in range(s.initial_replicas):
            opts = dict(options)
            if self._placement_group is not None:
                opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    self._placement_group, placement_group_bundle_index=i
                )
                if not cpus and not gpus and not s.placement.replica_resources:  # an empty bundle cannot be reserved
                    opts["num_cpus"] = 0.001
            replica = remote.options(**opts).remote(self.engine_spec, i)
            self.replicas.append(replica)
            self.pending[i] = replica.ready.remote()
        self._wait_placed(list(self.pending.values()), [self._replica_demand()])
        self.pending.clear()

    def _replica_demand(self) -> NodeDemand:
        return replica_demand(self.settings, self.gpus_per_replica)
