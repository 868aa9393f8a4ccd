"""The batching coordinator: one async actor between every chain and every engine replica.

Chains `submit` the requests of their next round and await the completions. The coordinator
  - deduplicates: identical requests (same prompt, prefix, key and length) are computed once,
    whichever chains asked for them, including requests already in flight;
  - routes: a prompt's requests go to the replica that rendezvous hashing picks for its first
    `affinity_tokens` tokens, so chains of one prompt share that replica's prefix cache, unless
    that replica's queue is `affinity_slack` requests longer than the idlest one's;
  - batches: when a replica's queue goes as one call is the BatchingPolicy's rule (actors/batching.py);
  - survives replicas: when a call fails because its replica died, the call's requests go to
    another healthy replica (or wait for the restarted one); a probe puts the replica back;
  - follows the pool: replicas an autoscaler adds take work at once; one it retires takes no new
    work and is reported drained when its calls and streams have ended (actors/replica_autoscaler.py).
Chains that stream (`SamplerConfig.schedule = "streaming"`) go through `stream_open` and
`stream_exchange` instead (actors/stream_router.py): each request goes out as it arrives and each
event comes back as it lands, with no call and no barrier.

All of those rules are books without I/O (actors/coordinator_core.py: replica table, chain, call
and stream books) that take events and return commands. This actor feeds them events with the
clock, carries the commands out, and owns every `.remote()`, future and background task.
Completions are deterministic functions of their requests, so none of this changes a sample.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
import warnings
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import ray
from ray.actor import ActorProxy
from ray.exceptions import RayActorError

from actors.background_tasks import BackgroundTasks
from actors.coordinator_commands import (
    AbortStreams,
    BoundStreams,
    Command,
    PollReplica,
    ReplicaLost,
    SendCall,
    Settle,
    StartStreams,
    WakeChains,
    WakeStreams,
)
from actors.coordinator_core import CoordinatorCore
from actors.coordinator_stats import CoordinatorSnapshot
from actors.engine_replica import ReplicaHandle
from actors.metrics import CoordinatorMetrics
from actors.handles import remote_method
from actors.stream_protocol import ChainActions, ChainUpdate
from actors.stream_router import StreamRouter
from presto_ray.engines.base import Completion, ProposalRequest
from presto_ray.ray_config import RayConfig
from presto_ray.speculation import budget_by_load

# How long a dead replica may take to come back (a vLLM replica restarts in ~30-60 s on CPUs).
REPLICA_RESTART_TIMEOUT_S = 300.0


def start_coordinator(
    replicas: Sequence[ReplicaHandle],
    settings: RayConfig,
    replica_ids: list[int] | None = None,
    num_cluster_replicas: int | None = None,
    placement: Mapping[str, Any] | None = None,
) -> CoordinatorHandle:
    """The coordinator actor. Its state is soft (queues of in-flight rounds), so Ray may restart
    it: the rounds it held fail in their chains, which the drivers replay from their keys.
    `placement`: Ray options saying where it runs (`resources`, `scheduling_strategy`;
    actors/cluster.py's `coordinator_placement`)."""
    return (
        ray.remote(Coordinator)
        .options(num_cpus=0, max_concurrency=100_000, max_restarts=settings.coordinator_max_restarts, **(placement or {}))
        .remote(replicas, settings, replica_ids, num_cluster_replicas)
    )


class Coordinator:
    """`replicas` are the engine replicas this coordinator drives; when it is one shard of several
    (actors/coordinator_shards.py), `replica_ids` are their indices among the cluster's
    `num_cluster_replicas`, which its snapshot reports by."""

    def __init__(
        self,
        replicas: Sequence[ReplicaHandle],
        settings: RayConfig,
        replica_ids: list[int] | None = None,
        num_cluster_replicas: int | None = None,
    ) -> None:
        self.replicas: list[ReplicaHandle] = list(replicas)  # by position in the core's replica table
        self.settings = settings
        ids = list(replica_ids) if replica_ids is not None else list(range(len(self.replicas)))
        self.core = CoordinatorCore(settings, ids, num_cluster_replicas or len(self.replicas), epoch=uuid.uuid4().hex[:12])
        self.metrics = CoordinatorMetrics()
        self.tasks = BackgroundTasks()
        self.futures: dict[ProposalRequest, asyncio.Future[Completion]] = {}  # pending requests' answers
        self._wake: asyncio.Event | None = None
        self._dispatcher: asyncio.Task[None] | None = None
        self.streams = StreamRouter(self.core, self.replicas.__getitem__, self.tasks, self.metrics, self.carry_out)
        self._was_restarted: bool | None = None  # see `_restarted`

    # --- what chains call ----------------------------------------------------------------
    @remote_method
    async def submit(self, chain_id: Hashable, requests: list[ProposalRequest]) -> list[Completion]:
        """Completions for `requests`, in order."""
        self._start()
        loop = asyncio.get_running_loop()
        new = self.core.calls.submit(chain_id, requests, time.monotonic())
        for request in new:
            self.futures[request] = loop.create_future()
        self.metrics.record_deduplicated(len(requests) - len(new))
        self._after_chain_change()
        futures = [self.futures[request] for request in requests]
        self._poke()
        try:
            # shield: one chain giving up must not cancel a result other chains share
            return list(await asyncio.gather(*(asyncio.shield(f) for f in futures)))
        except asyncio.CancelledError:
            self._caller_cancelled(chain_id)
            raise
        finally:
            self.core.calls.submit_done(chain_id, time.monotonic())

    @remote_method
    async def round_budget(self, chain_id: Hashable, prefetch_budget: int) -> int:
        """A rounds chain's next budget: its share of the replicas' free batch among the chains
        this coordinator holds, itself included (presto_ray/speculation.py), so that at load a
        round asks what a serial chain asks."""
        active = self.core.chains.active
        return budget_by_load(prefetch_budget, len(active) + (chain_id not in active), await self.streams.free_batch())

    @remote_method
    async def stream_open(self, chain_id: Hashable, prefetch_budget: int) -> int:
        """A streaming chain starts (or starts again): its first budget of running requests."""
        self._start()  # the dispatch loop also expires active chains that fall silent
        budget = await self.streams.open(chain_id, prefetch_budget, time.monotonic())
        self._after_chain_change()
        return budget

    @remote_method
    async def stream_exchange(self, chain_id: Hashable, actions: ChainActions) -> ChainUpdate:
        """Abort, start and wake as the chain asks; answer with its next events as they land."""
        self.core.calls.last_activity = time.monotonic()
        try:
            return await self.streams.exchange(chain_id, actions)
        except asyncio.CancelledError:
            self._caller_cancelled(chain_id)
            raise

    @remote_method
    async def register_chains(self, chain_ids: list[Hashable]) -> None:
        """Chains about to start: the first dispatch waits (up to the window) for their plans too."""
        self._start()
        self.core.register(chain_ids, time.monotonic())
        self._after_chain_change()

    @remote_method
    def chain_finished(self, chain_id: Hashable) -> None:
        self.carry_out(self.core.chain_finished(chain_id))  # a streaming chain's leftover requests are aborted
        self.streams.forget_chain(chain_id)
        self._after_chain_change()
        self._poke()  # the remaining chains may now all be waiting

    def _caller_cancelled(self, chain_id: Hashable) -> None:
        self.carry_out(self.core.caller_cancelled(chain_id))
        self.streams.forget_chain(chain_id)
        self._after_chain_change()
        self._poke()

    def _after_chain_change(self) -> None:
        self.metrics.chains_active.set(len(self.core.chains.active))
        self._poke()  # the loop may sleep with no timer: it has had no chain to scan

    # --- the pool grows and shrinks (actors/replica_autoscaler.py) ---------------------------
    @remote_method
    async def add_replica(self, replica: ReplicaHandle, cluster_index: int) -> None:
        """A new engine replica: it takes its share of prompts (rendezvous moves only those) at once."""
        self.replicas.append(replica)
        self.core.add_replica(cluster_index)
        await self.streams.replicas_changed()
        self._poke()

    @remote_method
    async def retire_replica(self, cluster_index: int) -> None:
        """Send replica `cluster_index` no new work; what it queued goes to the others."""
        self.core.retire_replica(cluster_index)
        await self.streams.replicas_changed()
        self._poke()

    @remote_method
    def replica_indices(self) -> list[int]:
        """The cluster indices of the replicas this coordinator drives (retiring and retired too)."""
        return self.core.table.cluster_indices()

    @remote_method
    def replica_drained(self, cluster_index: int) -> bool:
        """A retiring replica has no call, queued request or stream left: the pool may stop it."""
        return self.core.replica_drained(cluster_index)

    @remote_method
    def forget_replica(self, cluster_index: int) -> None:
        """A drained replica is about to be killed: never route to, poll or probe it again."""
        self.streams.stop_polling(self.core.forget_replica(cluster_index))

    @remote_method
    def snapshot(self) -> CoordinatorSnapshot:
        """Counters, call costs and per-replica state (copies: the caller may keep them), the
        per-replica lists indexed by the cluster's replica index; a coordinator Ray restarted
        counts from its restart and says so (`incomplete_shards`)."""
        figures = self.core.snapshot()
        if self._restarted():
            return dataclasses.replace(figures, incomplete_shards=1)
        return figures

    def _restarted(self) -> bool:
        """Whether Ray restarted this coordinator: asked once (a query of Ray's state API) and kept,
        since a restart is a new process. Ray's own property reads its deprecated `actor_id`,
        whose warning would reach the driver's terminal as a line of this actor's: not shown."""
        if self._was_restarted is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                self._was_restarted = bool(ray.get_runtime_context().was_current_actor_reconstructed)
        return self._was_restarted

    @remote_method
    def shutdown(self) -> None:
        """Stop every background task (dispatch loop, calls, probes, pollers)."""
        self.tasks.cancel_all()
        self._dispatcher = None

    # --- carrying out the books' commands ------------------------------------------------------
    def carry_out(self, commands: Sequence[Command]) -> None:
        for command in commands:
            if isinstance(command, SendCall):
                self.tasks.spawn(self._call(command))
            elif isinstance(command, Settle):
                self._settle(command)
            elif isinstance(command, ReplicaLost):
                self.metrics.replica_failures.inc()
                if command.probe:
                    self.tasks.spawn(self._probe(command.replica))
            elif isinstance(command, (StartStreams, WakeStreams, BoundStreams, AbortStreams, PollReplica, WakeChains)):
                self.streams.carry_out(command)
            else:  # pragma: no cover - a new command type must be handled here
                raise TypeError(f"unknown command {command!r}")

    def _settle(self, command: Settle) -> None:
        future = self.futures.pop(command.request, None)
        if future is None or future.done():
            return
        if command.error is not None:
            future.set_exception(command.error)
        elif command.completion is not None:
            future.set_result(command.completion)

    def _poke(self) -> None:
        """Wake the dispatch loop (once it runs) to look at the queues again."""
        if self._wake is not None:
            self._wake.set()

    # --- batching ------------------------------------------------------------------------
    def _start(self) -> None:
        if self._dispatcher is None:
            self._wake = asyncio.Event()
            self._dispatcher = self.tasks.spawn(self._dispatch_loop())

    async def _dispatch_loop(self) -> None:
        assert self._wake is not None
        while True:
            deadline = self.core.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            expired = self.core.counters.chains_expired
            self.carry_out(self.core.dispatch(time.monotonic()))
            if self.core.counters.chains_expired != expired:
                self.metrics.chains_active.set(len(self.core.chains.active))
            self.metrics.queue_depth.set(self.core.calls.queue_depth())

    async def _call(self, command: SendCall) -> None:
        i = command.replica
        try:
            output = await self.replicas[i].generate.remote(list(command.requests))
        except RayActorError:
            self.carry_out(self.core.calls.call_lost(command.call_id, time.monotonic()))
        except Exception as error:  # the engine refused the requests (e.g. over its context): the chains fail
            self.carry_out(self.core.calls.call_rejected(command.call_id, error, time.monotonic()))
        else:
            self.carry_out(
                self.core.calls.call_finished(command.call_id, output.completions, output.accounting, time.monotonic())
            )
            self.metrics.record_call(i, len(command.requests), output.accounting, self.core.accounting)
        self._poke()

    # --- replica failures ----------------------------------------------------------------
    async def _probe(self, i: int) -> None:
        """Wait for Ray to restart replica i; then send it work again (or fail what waits for it)."""
        deadline = time.monotonic() + REPLICA_RESTART_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                await self.replicas[i].ready.remote()
            except RayActorError:
                await asyncio.sleep(0.5)
                continue
            self.carry_out(self.core.probe_answered(i))
            self._poke()
            return
        self.carry_out(self.core.probe_gave_up(i))


# What `start_coordinator` returns: `coordinator.submit.remote(chain_id, requests)` is typed.
CoordinatorHandle = ActorProxy[Coordinator]
