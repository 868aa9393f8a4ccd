"""The books of batched calls (the rounds schedule): dedup, routing, queues, batching, failover.
Pure: no Ray, no asyncio, no clock (time is passed in); events in, commands out
(actors/coordinator_commands.py). The coordinator actor maps requests to the futures chains await.

  - dedup: a request already pending (queued or in a call) is computed once for every chain;
  - routing: the replica table's affinity ranking, with queued plus running requests as load;
  - batching: when a queue goes as one call is the BatchingPolicy's rule (actors/batching.py); a
    call takes round robin over request groups when the queue holds more than one call takes;
  - failover: a call lost with its replica is queued again elsewhere with the replica's queue, and
    a request fails after `max_attempts` dying replicas.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from actors.batching import BatchingPolicy, fair_take, request_group
from actors.chain_book import ChainBook
from actors.coordinator_commands import Command, SendCall, Settle, replicas_lost
from actors.coordinator_stats import CoordinatorCounters
from actors.replica_table import QueuedRequest, ReplicaTable
from presto_ray.engines.base import CallAccounting, Completion, ProposalRequest


@dataclass
class _Call:
    replica: int
    items: list[QueuedRequest]


class CallBook:
    """Pending requests, the replicas' queues (in the shared ReplicaTable) and the calls in flight."""

    def __init__(
        self,
        table: ReplicaTable,
        chains: ChainBook,
        policy: BatchingPolicy,
        counters: CoordinatorCounters,
        accounting: CallAccounting,
        *,
        max_attempts: int,
    ) -> None:
        self.table, self.chains, self.policy = table, chains, policy
        self.counters, self.accounting, self.max_attempts = counters, accounting, max_attempts
        self.pending: set[ProposalRequest] = set()  # queued or in a call
        self.calls: dict[int, _Call] = {}
        self._ids = itertools.count()
        self.last_activity = 0.0  # a submit or a finished call: the batch window restarts

    # --- events ----------------------------------------------------------------------------------
    def submit(self, chain_id: Hashable, requests: Sequence[ProposalRequest], now: float) -> list[ProposalRequest]:
        """A chain asks for `requests`; the ones not pending yet (queued now), in order. The chain
        waits until `submit_done`."""
        if chain_id not in self.chains.finished:  # a late submit of a finished chain is served, not waited for
            self.chains.activate(chain_id, now)
        new = []
        for request in requests:
            if request in self.pending:
                self.counters.deduplicated += 1
                continue
            self.pending.add(request)
            self._enqueue(QueuedRequest(request, now, request_group(chain_id)))
            new.append(request)
        self.counters.submitted_requests += len(requests)
        self.last_activity = now
        self.chains.begin_wait(chain_id)
        return new

    def submit_done(self, chain_id: Hashable, now: float) -> None:
        """The chain's submit returned (answered, failed or cancelled)."""
        self.chains.end_wait(chain_id, now)

    def dispatch(self, now: float) -> list[SendCall]:
        """The calls due now (the caller expires silent chains first)."""
        policy, sends = self.policy, []
        released = policy.round_released(now, self.last_activity, self.chains.all_planned())
        for i, record in enumerate(self.table.records):
            queue = record.queue
            while self._can_call(i) and queue and policy.should_dispatch(now, len(queue), queue[0].enqueued, released):
                batch = self._take(i, policy.batch_size(len(queue)))
                record.inflight_calls += 1
                record.inflight_requests += len(batch)
                call_id = next(self._ids)
                self.calls[call_id] = _Call(i, batch)
                sends.append(SendCall(call_id, i, tuple(item.request for item in batch)))
        return sends

    def call_finished(
        self, call_id: int, completions: Sequence[Completion], accounting: CallAccounting, now: float
    ) -> list[Command]:
        call = self._end(call_id, now)
        record = self.table[call.replica]
        self.accounting.add(accounting)
        self.counters.max_requests_per_call = max(self.counters.max_requests_per_call, len(call.items))
        record.calls_made += 1
        return [self._settle(item.request, completion=c) for item, c in zip(call.items, completions)]

    def call_rejected(self, call_id: int, error: BaseException, now: float) -> list[Command]:
        """The engine refused the call's requests (e.g. over its context): their chains fail."""
        call = self._end(call_id, now)
        return [self._settle(item.request, error=error) for item in call.items]

    def call_lost(self, call_id: int, now: float) -> list[Command]:
        """The call's replica died: its requests and the replica's queue go to another replica
        (or wait for it to come back); a request fails after `max_attempts` dying replicas."""
        call = self.calls[call_id]
        i = call.replica
        commands: list[Command] = list(self.table.lose(i, self.counters))
        stranded = list(self.table[i].queue)
        self.table[i].queue.clear()
        for item in call.items:
            item.attempts += 1
        for item in call.items + stranded:
            if item.attempts >= self.max_attempts:
                error = RuntimeError(replicas_lost(item.attempts))
                commands.append(self._settle(item.request, error=error))
            else:
                self.counters.resent_requests += 1
                self._enqueue(item, avoid=i)
        self._end(call_id, now)
        return commands

    def retire(self, i: int) -> None:
        """Replica i takes no new work: what it queued goes to the others."""
        record = self.table[i]
        record.retiring = True
        stranded = list(record.queue)
        record.queue.clear()
        for item in stranded:
            self._enqueue(item, avoid=i)

    def fail_queued(self, message: str) -> list[Command]:
        """No replica is left to serve the queues: fail them rather than hang."""
        commands: list[Command] = []
        for record in self.table.records:
            while record.queue:
                commands.append(self._settle(record.queue.popleft().request, error=RuntimeError(message)))
        return commands

    # --- reading -------------------------------------------------------------------------------
    def queue_depth(self) -> int:
        return sum(len(r.queue) for r in self.table.records)

    def next_deadline(self) -> float | None:
        """When a queue could next become due without a new event (None: never). Only queues that
        may call now need a timer; the others wait for a call to end."""
        oldest = [r.queue[0].enqueued for i, r in enumerate(self.table.records) if r.queue and self._can_call(i)]
        return self.policy.next_deadline(self.last_activity, min(oldest, default=None))

    # --- inside --------------------------------------------------------------------------------
    def _can_call(self, i: int) -> bool:
        record = self.table[i]
        return record.healthy and self.policy.can_call(record.inflight_calls)

    def _load(self, i: int) -> int:
        record = self.table[i]
        return len(record.queue) + record.inflight_requests

    def _enqueue(self, item: QueuedRequest, avoid: int | None = None) -> None:
        target, missed = self.table.choose(item.request, self._load, avoid)
        self.counters.affinity_misses += missed
        self.table[target].queue.append(item)
        self.counters.max_queue_depth = max(self.counters.max_queue_depth, self.queue_depth())

    def _take(self, i: int, n: int) -> list[QueuedRequest]:
        """The next call's requests: the whole queue when it fits, else a fair share per group."""
        queue = self.table[i].queue
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

    def _end(self, call_id: int, now: float) -> _Call:
        call = self.calls.pop(call_id)
        record = self.table[call.replica]
        record.inflight_calls -= 1
        record.inflight_requests -= len(call.items)
        # the chains just served need a moment to plan: without this, requests queued during the
        # call would leave alone and the chains would stay split into two alternating calls
        self.last_activity = now
        return call

    def _settle(
        self, request: ProposalRequest, completion: Completion | None = None, error: BaseException | None = None
    ) -> Settle:
        self.pending.discard(request)
        return Settle(request, completion, error)
