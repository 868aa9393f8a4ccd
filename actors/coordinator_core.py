"""The coordinator without I/O: every book of one coordinator (replicas, chains, calls, streams) and
the events that touch more than one. Pure: no Ray, no asyncio, no clock (time is passed in); the
actor (actors/coordinator.py) feeds it events and carries out the commands it returns.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from actors.batching import BatchingPolicy
from actors.call_book import CallBook
from actors.chain_book import ChainBook
from actors.coordinator_commands import Command
from actors.coordinator_stats import CoordinatorCounters, CoordinatorSnapshot
from actors.replica_table import ReplicaTable
from actors.stream_book import StreamBook
from presto_ray.engines.base import CallAccounting
from presto_ray.ray_config import RayConfig


class CoordinatorCore:
    """`settings` is a RayConfig (the `ray:` section); `replica_ids` the cluster indices of the
    replicas driven, in the actor's order; `epoch` names this coordinator's streams on replicas."""

    def __init__(self, settings: RayConfig, replica_ids: Sequence[int], num_cluster_replicas: int, *, epoch: str) -> None:
        self.counters = CoordinatorCounters()
        self.accounting = CallAccounting()  # every call's and stream's cost, as the replicas measured it
        self.num_cluster_replicas = num_cluster_replicas
        self.table = ReplicaTable(replica_ids, affinity_tokens=settings.affinity_tokens, affinity_slack=settings.affinity_slack)
        self.chains = ChainBook(settings.chain_idle_timeout_s, self.counters)
        self.calls = CallBook(
            self.table, self.chains, BatchingPolicy.from_settings(settings), self.counters, self.accounting,
            max_attempts=settings.max_call_attempts,
        )  # fmt: skip
        self.streams = StreamBook(
            self.table, self.counters, self.accounting, epoch=epoch, max_attempts=settings.max_call_attempts
        )

    # --- chains ----------------------------------------------------------------------------------
    def register(self, chain_ids: Sequence[Hashable], now: float) -> None:
        """Chains about to start (replayed ones too): the first dispatch waits for their plans."""
        for chain_id in chain_ids:
            self.chains.reopen(chain_id, now)

    def stream_open(self, chain_id: Hashable, prefetch_budget: int, now: float) -> tuple[int, list[Command]]:
        self.chains.reopen(chain_id, now)
        return self.streams.open(chain_id, prefetch_budget)

    def chain_finished(self, chain_id: Hashable) -> list[Command]:
        """The chain is over: its leftover streams are aborted (said twice: nothing the second time)."""
        if chain_id in self.chains.finished:
            return []
        commands = self.streams.close(chain_id)
        self.chains.finish(chain_id)
        return commands

    def caller_cancelled(self, chain_id: Hashable) -> list[Command]:
        """The chain's driver was cancelled mid-call (Ray cancels a cancelled Serve request's
        calls, and may cancel its `chain_finished` too): the chain is over."""
        self.counters.chains_abandoned += 1
        return self.chain_finished(chain_id)

    # --- time passes -----------------------------------------------------------------------------
    def dispatch(self, now: float) -> list[Command]:
        """Expire silent chains, then the calls due now."""
        self.chains.expire_silent(now, self.streams.has_mailbox)
        return list(self.calls.dispatch(now))

    def next_deadline(self) -> float | None:
        """When `dispatch` should next run without a new event (None: only on an event)."""
        deadlines = [d for d in (self.calls.next_deadline(), self.chains.next_deadline()) if d is not None]
        return min(deadlines, default=None)

    # --- replicas --------------------------------------------------------------------------------
    def add_replica(self, cluster_index: int) -> int:
        """A new replica (it takes its share of prompts at once); its position."""
        self.num_cluster_replicas = max(self.num_cluster_replicas, cluster_index + 1)
        return self.table.add(cluster_index)

    def retire_replica(self, cluster_index: int) -> None:
        self.calls.retire(self.table.position(cluster_index))

    def replica_drained(self, cluster_index: int) -> bool:
        """A retiring replica has no call, queued request or stream left: the pool may stop it."""
        r = self.table[self.table.position(cluster_index)]
        return r.retiring and not r.inflight_calls and not r.queue and not r.live_streams

    def forget_replica(self, cluster_index: int) -> int:
        """A drained replica is about to be killed: never route to, poll or probe it again; its position."""
        i = self.table.position(cluster_index)
        record = self.table[i]
        record.retired, record.healthy = True, False
        self.streams.forget_replica(i)
        return i

    def probe_answered(self, i: int) -> list[Command]:
        """Ray restarted replica i: it takes work again, starting with the streams parked for it."""
        self.table[i].healthy = True
        return self.streams.replica_back(i)

    def probe_gave_up(self, i: int) -> list[Command]:
        """Replica i never came back: with no healthy replica left, fail what waits rather than hang."""
        if self.table.any_healthy():
            return []
        message = "every engine replica died"
        return self.calls.fail_queued(message) + self.streams.fail_parked(message)

    # --- figures ---------------------------------------------------------------------------------
    def snapshot(self) -> CoordinatorSnapshot:
        """Counters, costs and per-replica state (copies), per-replica lists by cluster index."""
        n, table = self.num_cluster_replicas, self.table
        return CoordinatorSnapshot(
            counters=CoordinatorCounters(**vars(self.counters)),
            accounting=CallAccounting(**vars(self.accounting)),
            calls_per_replica=table.by_cluster_index(lambda r: r.calls_made, 0, n),
            inflight_calls_per_replica=table.by_cluster_index(lambda r: r.inflight_calls, 0, n),
            inflight_requests_per_replica=table.by_cluster_index(lambda r: r.inflight_requests, 0, n),
            active_replicas=sum(not r.retiring for r in table.records),
            healthy=table.by_cluster_index(lambda r: r.healthy, True, n),
            queue_depth=self.calls.queue_depth(),
            chains_active=len(self.chains.active),
            streams_running=self.streams.running(),
        )
