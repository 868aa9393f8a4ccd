"""The batching coordinator: one async actor between every chain and every engine replica.

Chains `submit` the requests of their next round and await the completions. The coordinator
  - deduplicates: identical requests (same prompt, prefix, key and length) are computed once,
    whichever chains asked for them, including requests already in flight;
  - routes: a prompt's requests go to the replica that rendezvous hashing picks for its first
    `affinity_tokens` tokens, so chains of one prompt share that replica's prefix cache, unless
    that replica's queue is `affinity_slack` requests longer than the idlest one's;
  - batches: when a replica's queue goes as one call is the BatchingPolicy's rule
    (actors/batching.py); this actor only feeds it the clock, the queues and who has planned;
  - survives replicas: when a call fails because its replica died, the call's requests go to
    another healthy replica (or wait for the restarted one); a probe puts the replica back;
  - follows the pool: replicas an autoscaler adds take work at once; one it retires takes no new
    work and is reported drained when its calls and streams have ended (actors/replica_autoscaler.py).
Chains that stream (`SamplerConfig.schedule = "streaming"`) go through `stream_open` and
`stream_exchange` instead: actors/stream_router.py forwards each request as it arrives and returns
each event as it lands, with no call and no barrier.
Completions are deterministic functions of their requests, so none of this changes a sample.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

import ray
from ray.exceptions import RayActorError

from actors.batching import BatchingPolicy, fair_take, request_group
from actors.coordinator_shards import prefix_key, rendezvous_order
from actors.coordinator_stats import CoordinatorCounters, CoordinatorSnapshot
from actors.metrics import CoordinatorMetrics
from actors.replica_choice import choose_replica
from actors.stream_protocol import ChainActions, ChainUpdate
from actors.stream_router import StreamRouter
from presto_ray.engines.base import CallAccounting, Completion, ProposalRequest

# Finished chain ids remembered to ignore their late submits (see Coordinator.finished).
FINISHED_CHAINS_KEPT = 65_536
# How long a dead replica may take to come back (a vLLM replica restarts in ~30-60 s on CPUs).
REPLICA_RESTART_TIMEOUT_S = 300.0


@dataclass
class _Queued:
    request: ProposalRequest
    future: asyncio.Future
    enqueued: float
    group: object  # the request (group of chains) that first asked: calls are shared fairly by group
    attempts: int = 0


def start_coordinator(replicas: list, settings, replica_ids: list[int] | None = None, num_cluster_replicas: int | None = None):
    """The coordinator actor. Its state is soft (queues of in-flight rounds), so Ray may restart
    it: the rounds it held fail in their chains, which the drivers replay from their keys."""
    return (
        ray.remote(Coordinator)
        .options(num_cpus=0, max_concurrency=100_000, max_restarts=settings.coordinator_max_restarts)
        .remote(replicas, settings, replica_ids, num_cluster_replicas)
    )


class Coordinator:
    """`replicas` are the engine replicas this coordinator drives; when it is one shard of several
    (actors/coordinator_shards.py), `replica_ids` are their indices among the cluster's
    `num_cluster_replicas`, which its snapshot reports by."""

    def __init__(
        self, replicas: list, settings, replica_ids: list[int] | None = None, num_cluster_replicas: int | None = None
    ) -> None:
        self.replicas = list(replicas)
        self.settings = settings
        self.replica_ids = list(replica_ids) if replica_ids is not None else list(range(len(self.replicas)))
        self.num_cluster_replicas = num_cluster_replicas or len(self.replicas)
        self.policy = BatchingPolicy.from_settings(settings)
        n = len(self.replicas)
        self.healthy = [True] * n
        self.retiring: set[int] = set()  # no new work; its running work ends where it is
        self.retired: set[int] = set()  # gone for good (killed by the pool): never routed to, never probed
        self.queues: list[deque[_Queued]] = [deque() for _ in range(n)]
        self.inflight_calls = [0] * n
        self.inflight_requests = [0] * n
        self.calls_per_replica = [0] * n
        self.pending: dict[ProposalRequest, asyncio.Future] = {}
        self.active_chains: set = set()
        # chains that finished: an async actor may run one caller's calls out of order, so a
        # submit that lands after its chain_finished (a cancelled request) must not register the
        # chain again, or "every chain has planned" would never hold (bounded: the oldest go)
        self.finished: OrderedDict = OrderedDict()
        self.waiting: dict[object, int] = {}
        # when each active chain last called: one silent past chain_idle_timeout_s stops holding
        # rounds back (its driver vanished without a word); its next call makes it active again
        self.last_call: dict[object, float] = {}
        self._next_expiry_scan = 0.0
        self.stats = CoordinatorCounters()
        self.accounting = CallAccounting()  # every call's cost, as the replicas measured it
        self.metrics = CoordinatorMetrics()
        self._last_activity = 0.0
        self._wake: asyncio.Event | None = None
        self._dispatcher: asyncio.Task | None = None
        self.streams = StreamRouter(
            self.replicas,
            self.healthy,
            self._ranking,
            retiring=self.retiring,
            affinity_slack=settings.affinity_slack,
            max_attempts=settings.max_call_attempts,
            counters=self.stats,
            accounting=self.accounting,
            on_replica_lost=self._mark_lost,
        )

    # --- what chains call ----------------------------------------------------------------
    async def submit(self, chain_id, requests: list[ProposalRequest]) -> list[Completion]:
        """Completions for `requests`, in order."""
        self._start()
        if chain_id not in self.finished:
            self._activate(chain_id)
        loop = asyncio.get_running_loop()
        futures = []
        for request in requests:
            future = self.pending.get(request)
            if future is None:
                future = self.pending[request] = loop.create_future()
                self._enqueue(_Queued(request, future, time.monotonic(), request_group(chain_id)))
            else:
                self.stats.deduplicated += 1
            futures.append(future)
        self.stats.submitted_requests += len(requests)
        self._last_activity = time.monotonic()
        self.waiting[chain_id] = self.waiting.get(chain_id, 0) + 1
        self._wake.set()
        try:
            # shield: one chain giving up must not cancel a result other chains share
            return list(await asyncio.gather(*(asyncio.shield(f) for f in futures)))
        except asyncio.CancelledError:
            self._caller_cancelled(chain_id)
            raise
        finally:
            self.waiting[chain_id] -= 1
            if not self.waiting[chain_id]:
                del self.waiting[chain_id]
            if chain_id in self.active_chains:
                self.last_call[chain_id] = time.monotonic()

    async def stream_open(self, chain_id, prefetch_budget: int) -> int:
        """A streaming chain starts (or starts again): its first budget of running requests."""
        self.finished.pop(chain_id, None)
        self._activate(chain_id)
        return await self.streams.open(chain_id, prefetch_budget)

    async def stream_exchange(self, chain_id, actions: ChainActions) -> ChainUpdate:
        """Abort, start and wake as the chain asks; answer with its next events as they land."""
        self._last_activity = time.monotonic()
        try:
            return await self.streams.exchange(chain_id, actions)
        except asyncio.CancelledError:
            self._caller_cancelled(chain_id)
            raise

    async def register_chains(self, chain_ids: list) -> None:
        """Chains about to start: the first dispatch waits (up to the window) for their plans too."""
        for chain_id in chain_ids:
            self.finished.pop(chain_id, None)  # a replayed chain starts again
            self._activate(chain_id)

    def chain_finished(self, chain_id) -> None:
        if chain_id in self.finished:
            return  # said twice: by its cancelled caller's call and by its driver
        self.streams.close(chain_id)  # a streaming chain's leftover requests are aborted
        self.active_chains.discard(chain_id)
        self.last_call.pop(chain_id, None)
        self.finished[chain_id] = None
        if len(self.finished) > FINISHED_CHAINS_KEPT:
            self.finished.popitem(last=False)
        self.stats.chains_finished += 1
        self.metrics.chains_active.set(len(self.active_chains))
        self._poke()  # the remaining chains may now all be waiting

    def _activate(self, chain_id) -> None:
        self._start()  # the dispatch loop also expires active chains that fall silent
        self.active_chains.add(chain_id)
        if len(self.active_chains) == 1:
            self._poke()  # the loop may sleep with no timer: it has had no chain to scan
        self.last_call[chain_id] = time.monotonic()
        self.metrics.chains_active.set(len(self.active_chains))

    def _caller_cancelled(self, chain_id) -> None:
        """The chain's driver was cancelled mid-call (Ray cancels a cancelled Serve request's
        calls, and may cancel its `chain_finished` too): the chain is over."""
        self.stats.chains_abandoned += 1
        self.chain_finished(chain_id)

    def _expire_silent_chains(self, now: float) -> None:
        """Chains that have not called for `chain_idle_timeout_s`, with no call in flight and no
        open stream, stop counting as active (a driver lost without a word)."""
        if now < self._next_expiry_scan:
            return  # scanned lately: the dispatch loop runs this on every wake-up
        self._next_expiry_scan = now + min(1.0, self.settings.chain_idle_timeout_s / 4)
        limit = now - self.settings.chain_idle_timeout_s
        silent = [
            c for c in self.active_chains
            if self.last_call.get(c, now) < limit and c not in self.waiting and c not in self.streams.mailboxes
        ]
        for chain_id in silent:
            self.active_chains.discard(chain_id)
            self.last_call.pop(chain_id, None)
            self.stats.chains_expired += 1
        if silent:
            self.metrics.chains_active.set(len(self.active_chains))

    # --- the pool grows and shrinks (actors/replica_autoscaler.py) ---------------------------
    async def add_replica(self, replica, cluster_index: int) -> None:
        """A new engine replica: it takes its share of prompts (rendezvous moves only those) at once."""
        self.replicas.append(replica)
        self.healthy.append(True)
        self.queues.append(deque())
        self.inflight_calls.append(0)
        self.inflight_requests.append(0)
        self.calls_per_replica.append(0)
        self.replica_ids.append(cluster_index)
        self.num_cluster_replicas = max(self.num_cluster_replicas, cluster_index + 1)
        await self.streams.replicas_changed()
        self._poke()

    async def retire_replica(self, cluster_index: int) -> None:
        """Send replica `cluster_index` no new work; what it queued goes to the others."""
        i = self.replica_ids.index(cluster_index)
        self.retiring.add(i)
        stranded = list(self.queues[i])
        self.queues[i].clear()
        for item in stranded:
            self._enqueue(item, avoid=i)
        await self.streams.replicas_changed()
        self._poke()

    def replica_indices(self) -> list[int]:
        """The cluster indices of the replicas this coordinator drives (retiring and retired too)."""
        return list(self.replica_ids)

    def replica_drained(self, cluster_index: int) -> bool:
        """A retiring replica has no call, queued request or stream left: the pool may stop it."""
        i = self.replica_ids.index(cluster_index)
        return i in self.retiring and not self.inflight_calls[i] and not self.queues[i] and not self.streams.live[i]

    def forget_replica(self, cluster_index: int) -> None:
        """A drained replica is about to be killed: never route to, poll or probe it again."""
        i = self.replica_ids.index(cluster_index)
        self.retired.add(i)
        self.healthy[i] = False
        self.streams.stop_polling(i)

    def snapshot(self) -> CoordinatorSnapshot:
        """Counters, call costs and per-replica state (copies: the caller may keep them), the
        per-replica lists indexed by the cluster's replica index."""
        return CoordinatorSnapshot(
            counters=CoordinatorCounters(**vars(self.stats)),
            accounting=CallAccounting(**vars(self.accounting)),
            calls_per_replica=self._by_cluster_index(self.calls_per_replica, 0),
            inflight_calls_per_replica=self._by_cluster_index(self.inflight_calls, 0),
            inflight_requests_per_replica=self._by_cluster_index(self.inflight_requests, 0),
            active_replicas=len(self.replicas) - len(self.retiring),
            healthy=self._by_cluster_index(self.healthy, True),
            queue_depth=sum(len(q) for q in self.queues),
            chains_active=len(self.active_chains),
            streams_running=len(self.streams.streams),
        )

    def _by_cluster_index(self, values: list, absent) -> list:
        out = [absent] * self.num_cluster_replicas
        for i, value in zip(self.replica_ids, values):
            out[i] = value
        return out

    # --- routing -------------------------------------------------------------------------
    def _ranking(self, request: ProposalRequest) -> list[int]:
        """Replicas by rendezvous weight for the prompt's first tokens, computed once per request:
        adding or losing a replica moves only the prompts it held."""
        order = rendezvous_order(prefix_key(request.prompt_token_ids, self.settings.affinity_tokens), len(self.replicas))
        return [i for i in order if i not in self.retired] if self.retired else order

    def _poke(self) -> None:
        """Wake the dispatch loop (once it runs) to look at the queues again."""
        if self._wake is not None:
            self._wake.set()

    def _available(self, i: int) -> bool:
        return self.healthy[i] and i not in self.retiring

    def _load(self, i: int) -> int:
        return len(self.queues[i]) + self.inflight_requests[i]

    def _enqueue(self, item: _Queued, avoid: int | None = None) -> None:
        ranking = self._ranking(item.request)
        target = choose_replica(
            ranking, self._load, available=self._available, healthy=self.healthy.__getitem__,
            slack=self.settings.affinity_slack, avoid=avoid,
        )  # fmt: skip
        if target != ranking[0]:
            self.stats.affinity_misses += 1
        self.queues[target].append(item)
        depth = sum(len(q) for q in self.queues)
        self.stats.max_queue_depth = max(self.stats.max_queue_depth, depth)
        self.metrics.queue_depth.set(depth)

    # --- batching ------------------------------------------------------------------------
    def _start(self) -> None:
        if self._dispatcher is None:
            self._wake = asyncio.Event()
            self._dispatcher = asyncio.get_running_loop().create_task(self._dispatch_loop())

    def _all_planned(self) -> bool:
        # waiting is a subset of active_chains (submit adds a chain to both), so counting suffices
        return len(self.waiting) >= len(self.active_chains)

    async def _dispatch_loop(self) -> None:
        while True:
            # only queues that could dispatch now need a timer; the others wait for a call to end
            oldest = [q[0].enqueued for i, q in enumerate(self.queues) if q and self._can_call(i)]
            deadline = self.policy.next_deadline(self._last_activity, min(oldest, default=None))
            if self.active_chains:  # wake for the next silent-chain scan too (at most once a second)
                deadline = self._next_expiry_scan if deadline is None else min(deadline, self._next_expiry_scan)
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            self._dispatch_ready(time.monotonic())

    def _can_call(self, i: int) -> bool:
        return self.healthy[i] and self.policy.can_call(self.inflight_calls[i])

    def _dispatch_ready(self, now: float) -> None:
        policy = self.policy
        self._expire_silent_chains(now)
        released = policy.round_released(now, self._last_activity, self._all_planned())
        for i, queue in enumerate(self.queues):
            while self._can_call(i) and queue and policy.should_dispatch(now, len(queue), queue[0].enqueued, released):
                batch = self._take(queue, policy.batch_size(len(queue)))
                self.inflight_calls[i] += 1
                self.inflight_requests[i] += len(batch)
                asyncio.get_running_loop().create_task(self._call(i, batch))
        self.metrics.queue_depth.set(sum(len(q) for q in self.queues))

    @staticmethod
    def _take(queue: deque[_Queued], n: int) -> list[_Queued]:
        """The next call's requests: the whole queue when it fits, else a fair share per group."""
        if n >= len(queue):
            batch = list(queue)
            queue.clear()
            return batch
        chosen = set(fair_take([item.group for item in queue], n))
        batch = [item for k, item in enumerate(queue) if k in chosen]
        rest = [item for k, item in enumerate(queue) if k not in chosen]
        queue.clear()
        queue.extend(rest)
        return batch

    async def _call(self, i: int, batch: list[_Queued]) -> None:
        try:
            output = await self.replicas[i].generate.remote([item.request for item in batch])
        except RayActorError:
            self._replica_failed(i, batch)
        except Exception as error:  # the engine refused the requests (e.g. over its context): the chains fail
            for item in batch:
                self._settle(item, error=error)
        else:
            self._record_call(i, len(batch), output.accounting)
            for item, completion in zip(batch, output.completions):
                self._settle(item, completion)
        finally:
            self.inflight_calls[i] -= 1
            self.inflight_requests[i] -= len(batch)
            # the chains just served need a moment to plan: without this, requests queued during
            # the call would leave alone and the chains would stay split into two alternating calls
            self._last_activity = time.monotonic()
            self._wake.set()

    def _settle(self, item: _Queued, completion: Completion | None = None, error: BaseException | None = None) -> None:
        self.pending.pop(item.request, None)
        if item.future.done():
            return
        if error is not None:
            item.future.set_exception(error)
        else:
            item.future.set_result(completion)

    def _record_call(self, i: int, size: int, accounting: CallAccounting) -> None:
        self.accounting.add(accounting)
        self.stats.max_requests_per_call = max(self.stats.max_requests_per_call, size)
        self.calls_per_replica[i] += 1
        self.metrics.record_call(i, size, accounting, self.accounting)

    # --- replica failures ----------------------------------------------------------------
    def _mark_lost(self, i: int) -> None:
        """A call or stream on replica i failed because it died: stop using it until a probe answers."""
        if i in self.retired:
            return  # the pool killed it on purpose, after it drained
        self.stats.replica_failures += 1
        self.metrics.replica_failures.inc()
        if self.healthy[i]:
            self.healthy[i] = False
            asyncio.get_running_loop().create_task(self._probe(i))

    def _replica_failed(self, i: int, batch: list[_Queued]) -> None:
        self._mark_lost(i)
        stranded = list(self.queues[i])
        self.queues[i].clear()
        for item in batch:
            item.attempts += 1
        for item in batch + stranded:
            if item.attempts >= self.settings.max_call_attempts:
                self._settle(item, error=RuntimeError(f"request failed on {item.attempts} dying replicas"))
            else:
                self.stats.resent_requests += 1
                self._enqueue(item, avoid=i)

    async def _probe(self, i: int) -> None:
        """Wait for Ray to restart replica i; then send it work again (or fail what waits for it)."""
        deadline = time.monotonic() + REPLICA_RESTART_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                await self.replicas[i].ready.remote()
            except RayActorError:
                await asyncio.sleep(0.5)
                continue
            self.healthy[i] = True
            self._poke()
            return
        if not any(self.healthy):  # nobody left to serve the queue: fail it rather than hang
            for queue in self.queues:
                while queue:
                    self._settle(queue.popleft(), error=RuntimeError("every engine replica died"))
            self.streams.fail_parked("every engine replica died")
