"""The coordinator's streaming half: each request goes to a replica as the chain asks for it, and
each event goes back to its chain as it lands. No call, no barrier (docs/streaming.md).

  - dedup: identical requests share one stream, whichever chains asked; a stream is aborted on its
    replica only when no chain wants it any more;
  - routing: the same rendezvous ranking as rounds (prefix-cache affinity), with the replicas' live
    streams as their load;
  - budgets: every open request (group of chains) gets an equal share of the replicas' free batch,
    split equally among its chains (presto_ray/speculation.py, actors/batching.py), refreshed
    with each update, so speculation shrinks under load and no request starves another;
  - faults: when a replica dies its live streams start again on another one, with the fork points
    already asked for (completions are functions of their requests, so no sample changes).

The coordinator owns Ray, health and probes; this class only keeps the books of streams and
mailboxes and talks to replicas through their stream methods (actors/engine_replica.py).
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ray.exceptions import RayActorError

from actors.batching import fair_competitors, request_group
from actors.coordinator_stats import CoordinatorCounters
from actors.replica_choice import choose_replica
from actors.stream_protocol import (
    ChainActions,
    ChainEvent,
    ChainUpdate,
    ReplicaEvent,
    ReplicaStart,
    StreamId,
    StreamLost,
)
from presto_ray.chain import StreamKey
from presto_ray.engines.base import CallAccounting, ProposalRequest
from presto_ray.speculation import streaming_budget

# A replica's stream_events returns after this long even when nothing happened (idle polls are cheap).
POLL_TIMEOUT_S = 1.0


@dataclass(eq=False)
class _Stream:
    stream_id: StreamId
    request: ProposalRequest
    priority: float
    replica: int
    subscribers: set[tuple[object, StreamKey]] = field(default_factory=set)  # (chain id, the chain's key)
    wakes: set[int] = field(default_factory=set)
    attempts: int = 0
    sent: bool = False  # False: parked until its replica is healthy again


@dataclass(eq=False)
class _Mailbox:
    prefetch_budget: int
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    events: list[ChainEvent] = field(default_factory=list)
    subscriptions: dict[StreamKey, _Stream] = field(default_factory=dict)
    closed: bool = False


class StreamRouter:
    def __init__(
        self,
        replicas: list,
        healthy: list[bool],
        ranking: Callable[[ProposalRequest], list[int]],
        *,
        affinity_slack: int,
        max_attempts: int,
        counters: CoordinatorCounters,
        accounting: CallAccounting,
        on_replica_lost: Callable[[int], None],
        retiring: set[int] | None = None,
    ) -> None:
        self.replicas, self.healthy, self._ranking = replicas, healthy, ranking
        self.retiring = retiring if retiring is not None else set()  # the coordinator's: no new streams
        self.affinity_slack, self.max_attempts = affinity_slack, max_attempts
        self.counters, self.accounting, self._on_replica_lost = counters, accounting, on_replica_lost
        self.epoch = uuid.uuid4().hex[:12]
        self._ids = itertools.count()
        self.streams: dict[StreamId, _Stream] = {}
        self.by_request: dict[ProposalRequest, _Stream] = {}
        self.mailboxes: dict[object, _Mailbox] = {}
        self.group_sizes: Counter = Counter()  # open chains per request: budgets are fair per request
        self.live = [0] * len(replicas)
        self.free_batch: float | None = None
        self._pollers: dict[int, asyncio.Task] = {}

    # --- what chains call (through the coordinator) ---------------------------------------------
    async def open(self, chain_id, prefetch_budget: int) -> int:
        """Start (or restart: a replayed chain starts afresh) the chain's stream; its first budget."""
        self.close(chain_id)
        self.mailboxes[chain_id] = _Mailbox(prefetch_budget)
        self.group_sizes[request_group(chain_id)] += 1
        if self.free_batch is None:
            self.free_batch = await self._measure_free_batch()
        return self.budget(chain_id)

    def budget(self, chain_id) -> int:
        mailbox = self.mailboxes[chain_id]
        competitors = fair_competitors(self.group_sizes, request_group(chain_id))
        return streaming_budget(mailbox.prefetch_budget, competitors, self.free_batch or float("inf"))

    def close(self, chain_id) -> None:
        """The chain finished or was given up: drop its wishes; a waiting exchange returns empty
        (a driver that still runs learns of it on its next exchange: StreamLost)."""
        mailbox = self.mailboxes.pop(chain_id, None)
        if mailbox is None:
            return
        group = request_group(chain_id)
        self.group_sizes[group] -= 1
        if not self.group_sizes[group]:
            del self.group_sizes[group]
        mailbox.closed = True
        mailbox.ready.set()
        self._unsubscribe(chain_id, mailbox, list(mailbox.subscriptions))

    async def exchange(self, chain_id, actions: ChainActions) -> ChainUpdate:
        """Apply the chain's actions, then wait until at least one of its events has landed."""
        mailbox = self.mailboxes.get(chain_id)
        if mailbox is None:
            raise StreamLost(f"chain {chain_id} has no open stream (the coordinator restarted?)")
        self._unsubscribe(chain_id, mailbox, actions.abort)
        await self._start(chain_id, mailbox, actions.start)
        self._wake(mailbox, actions.wakes)
        while not mailbox.events and not mailbox.closed:
            mailbox.ready.clear()
            await mailbox.ready.wait()
        if mailbox.closed:  # its driver gave up (e.g. an HTTP client left): nobody reads this answer
            return ChainUpdate((), 0)
        events, mailbox.events = mailbox.events, []
        return ChainUpdate(tuple(events), self.budget(chain_id))

    # --- requests to replicas ---------------------------------------------------------------------
    async def _start(self, chain_id, mailbox: _Mailbox, starts) -> None:
        self.counters.submitted_requests += len(starts)
        new: list[_Stream] = []
        for start in starts:
            stream = self.by_request.get(start.request)
            if stream is not None:
                self.counters.deduplicated += 1
            else:
                stream = _Stream((self.epoch, next(self._ids)), start.request, start.priority, -1)
                self.streams[stream.stream_id] = self.by_request[start.request] = stream
                self._place(stream)
                new.append(stream)
            stream.subscribers.add((chain_id, start.key))
            mailbox.subscriptions[start.key] = stream
        self.counters.streamed_requests += len(new)
        await self._send(new)

    async def _send(self, streams: Sequence[_Stream]) -> None:
        """Submit `streams` to their replicas; those whose replica is down stay parked until it is back."""
        sends: dict[int, list[ReplicaStart]] = defaultdict(list)
        for stream in streams:
            if self.healthy[stream.replica]:
                stream.sent = True
                start = ReplicaStart(stream.stream_id, stream.request, stream.priority, tuple(sorted(stream.wakes)))
                sends[stream.replica].append(start)
        await asyncio.gather(*(self._submit(i, batch) for i, batch in sends.items()))

    def _place(self, stream: _Stream, avoid: int | None = None) -> None:
        ranking = self._ranking(stream.request)
        target = choose_replica(
            ranking, self.live.__getitem__, available=self._available, healthy=self.healthy.__getitem__,
            slack=self.affinity_slack, avoid=avoid,
        )  # fmt: skip
        if target != ranking[0]:
            self.counters.affinity_misses += 1
        stream.replica = target
        self.live[target] += 1
        if target not in self._pollers:
            self._pollers[target] = asyncio.get_running_loop().create_task(self._poll(target))

    async def _submit(self, i: int, batch: list[ReplicaStart]) -> None:
        try:
            await self.replicas[i].stream_submit.remote(batch)
        except RayActorError:
            self._replica_lost(i)

    def _wake(self, mailbox: _Mailbox, wakes: Sequence[tuple[StreamKey, int]]) -> None:
        sends: dict[int, list[tuple[StreamId, int]]] = defaultdict(list)
        for key, generated in wakes:
            stream = mailbox.subscriptions.get(key)
            if stream is not None and generated not in stream.wakes:
                stream.wakes.add(generated)
                if stream.sent:  # a parked stream takes its wakes along when it is sent
                    sends[stream.replica].append((stream.stream_id, generated))
        for i, batch in sends.items():
            self._fire(self.replicas[i].stream_wake.remote(batch))

    def _unsubscribe(self, chain_id, mailbox: _Mailbox, keys: Sequence[StreamKey]) -> None:
        aborts: dict[int, list[StreamId]] = defaultdict(list)
        for key in keys:
            stream = mailbox.subscriptions.pop(key, None)
            if stream is None:
                continue
            stream.subscribers.discard((chain_id, key))
            if not stream.subscribers and stream.stream_id in self.streams:
                self._forget(stream)
                if stream.sent:
                    aborts[stream.replica].append(stream.stream_id)
                    self.counters.stream_aborts += 1
        for i, batch in aborts.items():
            self._fire(self.replicas[i].stream_abort.remote(batch))

    def _forget(self, stream: _Stream) -> None:
        del self.streams[stream.stream_id]
        self.by_request.pop(stream.request, None)
        self.live[stream.replica] -= 1

    # --- events from replicas ---------------------------------------------------------------------
    async def _poll(self, i: int) -> None:
        while True:
            if not self.healthy[i]:
                await asyncio.sleep(0.2)  # the coordinator's probe marks it healthy again
                continue
            parked = [s for s in self.streams.values() if s.replica == i and not s.sent]
            if parked:
                await self._send(parked)
            try:
                reply = await self.replicas[i].stream_events.remote(self.epoch, POLL_TIMEOUT_S)
            except RayActorError:
                self._replica_lost(i)
                continue
            self.accounting.add(reply.accounting)
            orphans = []
            for event in reply.events:
                stream = self.streams.get(event.stream_id)
                if stream is None or stream.replica != i:
                    if not event.ended:
                        orphans.append(event.stream_id)  # dropped here while its event was on the way
                    continue
                self._deliver(stream, event)
            if orphans:
                self._fire(self.replicas[i].stream_abort.remote(orphans))

    def _deliver(self, stream: _Stream, event: ReplicaEvent) -> None:
        if event.ended:
            self._forget(stream)
        for chain_id, key in stream.subscribers:
            mailbox = self.mailboxes.get(chain_id)
            if mailbox is None:
                continue
            if event.ended:
                mailbox.subscriptions.pop(key, None)
            mailbox.events.append(ChainEvent(key, event.generated, event.partial, event.completion, event.error))
            mailbox.ready.set()

    def _replica_lost(self, i: int) -> None:
        """Replica i died: its live streams start again elsewhere (or fail after too many tries)."""
        self._on_replica_lost(i)
        lost = [s for s in self.streams.values() if s.replica == i and s.sent]
        resend = []
        for stream in lost:
            stream.attempts += 1
            stream.sent = False
            if stream.attempts >= self.max_attempts:
                self._deliver(stream, ReplicaEvent(stream.stream_id, 0, error=f"request failed on {stream.attempts} dying replicas"))
                continue
            self.counters.resent_requests += 1
            self.live[i] -= 1
            self._place(stream, avoid=i)
            resend.append(stream)
        if resend:
            self._fire(self._send(resend))

    def fail_parked(self, message: str) -> None:
        """No replica came back: every stream waiting for one fails in its chains."""
        for stream in [s for s in self.streams.values() if not s.sent]:
            self._deliver(stream, ReplicaEvent(stream.stream_id, 0, error=message))

    def _available(self, i: int) -> bool:
        return self.healthy[i] and i not in self.retiring

    async def replicas_changed(self) -> None:
        """A replica joined or is retiring: the live counts follow, and the free batch the streaming
        budgets share is measured again once a stream has opened."""
        self.live.extend([0] * (len(self.replicas) - len(self.live)))
        if self.free_batch is not None:
            self.free_batch = await self._measure_free_batch()

    def stop_polling(self, i: int) -> None:
        poller = self._pollers.pop(i, None)
        if poller is not None:
            poller.cancel()

    async def _measure_free_batch(self) -> float:
        taking = [r for i, r in enumerate(self.replicas) if self._available(i)]
        answers = await asyncio.gather(*(r.free_batch.remote() for r in taking), return_exceptions=True)
        return float(sum(a for a in answers if not isinstance(a, BaseException)))

    @staticmethod
    def _fire(awaitable) -> None:
        """Send without waiting: a lost replica shows up in its poller, which re-sends its streams."""

        async def send() -> None:
            try:
                await awaitable
            except RayActorError:
                pass

        asyncio.get_running_loop().create_task(send())
