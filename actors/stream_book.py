"""The books of streams (the streaming schedule, docs/streaming.md): dedup by request, subscribers,
mailboxes of events, budgets, and re-sending a dead replica's streams. Pure: no Ray, no asyncio, no
clock; events in, commands out (actors/coordinator_commands.py).

  - dedup: identical requests share one stream, whichever chains asked; a stream is aborted on its
    replica only when no chain wants it any more;
  - routing: the replica table's affinity ranking, with the replicas' live streams as their load;
  - budgets: every open request (group of chains) gets an equal share of the replicas' free batch,
    split equally among its chains (presto_ray/speculation.py, actors/batching.py);
  - faults: a dead replica's streams start again on another one with the fork points already asked
    for (completions are functions of their requests, so no sample changes), or stay parked until
    a replica is back.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from actors.batching import fair_competitors, request_group
from actors.coordinator_commands import (
    AbortStreams,
    BoundStreams,
    Command,
    PollReplica,
    StartStreams,
    WakeChains,
    WakeStreams,
    replicas_lost,
)
from actors.coordinator_stats import CoordinatorCounters
from actors.replica_table import ReplicaTable
from actors.stream_protocol import ChainActions, ChainEvent, ChainUpdate, ReplicaEvent, ReplicaEvents, ReplicaStart, StreamId, StreamLost
from presto_ray.chain import ProposalKey
from presto_ray.early_rejection import RejectionBound
from presto_ray.engines.base import CallAccounting, ProposalRequest
from presto_ray.speculation import budget_by_load


@dataclass(eq=False)
class _Stream:
    stream_id: StreamId
    request: ProposalRequest
    priority: float
    replica: int
    subscribers: set[tuple[Hashable, ProposalKey]] = field(default_factory=set)  # (chain id, the chain's key)
    wakes: set[int] = field(default_factory=set)
    attempts: int = 0
    sent: bool = False  # False: parked until its replica is healthy again
    bounds: tuple[RejectionBound, ...] | None = None  # early rejection: set by its chain since it started

    def start(self) -> ReplicaStart:
        request = self.request if self.bounds is None else replace(self.request, rejection_bounds=self.bounds)
        return ReplicaStart(self.stream_id, request, self.priority, tuple(sorted(self.wakes)))


@dataclass(frozen=True)
class Exchanged:
    """What a chain's actions came to: its mailbox generation (to read its update by), the
    commands, and how many of its starts joined a stream already running."""

    generation: int
    commands: list[Command]
    deduplicated: int


@dataclass(eq=False)
class _Mailbox:
    prefetch_budget: int
    generation: int  # which opening of the chain this is: a replayed chain's old exchange gets nothing
    events: list[ChainEvent] = field(default_factory=list)
    subscriptions: dict[ProposalKey, _Stream] = field(default_factory=dict)


class StreamBook:
    """Streams by id and by request, and one mailbox per open chain."""

    def __init__(
        self, table: ReplicaTable, counters: CoordinatorCounters, accounting: CallAccounting, *, epoch: str, max_attempts: int
    ) -> None:
        self.table, self.counters, self.accounting = table, counters, accounting
        self.epoch, self.max_attempts = epoch, max_attempts
        self._ids = itertools.count()
        self._generations = itertools.count()
        self.streams: dict[StreamId, _Stream] = {}
        self.by_request: dict[ProposalRequest, _Stream] = {}
        self.mailboxes: dict[Hashable, _Mailbox] = {}
        self.group_sizes: Counter[Hashable] = Counter()  # open chains per request: budgets are fair per request
        self.free_batch: float | None = None  # the replicas' summed free batch, once measured
        self.polled: set[int] = set()  # replicas whose events are being polled

    # --- chains --------------------------------------------------------------------------------
    def open(self, chain_id: Hashable, prefetch_budget: int) -> tuple[int, list[Command]]:
        """Start (or restart: a replayed chain starts afresh) the chain's mailbox: its generation,
        and what closing the previous one takes. Its budget once `free_batch` is known."""
        commands = self.close(chain_id)
        generation = next(self._generations)
        self.mailboxes[chain_id] = _Mailbox(prefetch_budget, generation)
        self.group_sizes[request_group(chain_id)] += 1
        return generation, commands

    def budget(self, chain_id: Hashable) -> int:
        mailbox = self.mailboxes[chain_id]
        competitors = fair_competitors(self.group_sizes, request_group(chain_id))
        return budget_by_load(mailbox.prefetch_budget, competitors, self.free_batch or float("inf"))

    def close(self, chain_id: Hashable) -> list[Command]:
        """The chain finished or was given up: drop its wishes (aborting streams nobody else wants)
        and wake its waiting exchange, which returns empty."""
        mailbox = self.mailboxes.pop(chain_id, None)
        if mailbox is None:
            return []
        group = request_group(chain_id)
        self.group_sizes[group] -= 1
        if not self.group_sizes[group]:
            del self.group_sizes[group]
        return [*self._unsubscribe(chain_id, mailbox, list(mailbox.subscriptions)), WakeChains((chain_id,))]

    def exchange(self, chain_id: Hashable, actions: ChainActions) -> Exchanged:
        """Apply the chain's aborts, starts, wakes and bounds. Raises StreamLost for a chain with no open mailbox."""
        mailbox = self.mailboxes.get(chain_id)
        if mailbox is None:
            raise StreamLost(f"chain {chain_id} has no open stream (the coordinator restarted?)")
        deduplicated = self.counters.deduplicated
        commands = self._unsubscribe(chain_id, mailbox, actions.abort)
        commands += self._start(chain_id, mailbox, actions.start)
        commands += self._wake(mailbox, actions.wakes)
        commands += self._bound(mailbox, actions.bounds)
        return Exchanged(mailbox.generation, commands, self.counters.deduplicated - deduplicated)

    def take_update(self, chain_id: Hashable, generation: int) -> ChainUpdate | None:
        """The chain's events so far and its budget; None: nothing yet (wait for WakeChains). An
        empty update with budget 0 when this mailbox was closed (nobody reads the answer)."""
        mailbox = self.mailboxes.get(chain_id)
        if mailbox is None or mailbox.generation != generation:
            return ChainUpdate((), 0)
        if not mailbox.events:
            return None
        events, mailbox.events = mailbox.events, []
        return ChainUpdate(tuple(events), self.budget(chain_id))

    def has_mailbox(self, chain_id: Hashable) -> bool:
        return chain_id in self.mailboxes

    # --- replicas ------------------------------------------------------------------------------
    def events_arrived(self, i: int, reply: ReplicaEvents) -> list[Command]:
        """A poll of replica i answered: deliver its events; abort streams dropped here while
        their events were on the way."""
        self.accounting.add(reply.accounting)
        orphans: list[StreamId] = []
        woken: set[Hashable] = set()
        for event in reply.events:
            stream = self.streams.get(event.stream_id)
            if stream is None or stream.replica != i:
                if not event.ended:
                    orphans.append(event.stream_id)
                continue
            woken.update(self._deliver(stream, event))
        commands: list[Command] = [AbortStreams(i, tuple(orphans))] if orphans else []
        if woken:
            commands.append(WakeChains(tuple(sorted(woken, key=repr))))
        return commands

    def replica_lost(self, i: int) -> list[Command]:
        """Replica i died (its submit or poll failed): count it, and start its sent streams again
        elsewhere, wakes included, or fail them after `max_attempts` dying replicas."""
        commands: list[Command] = list(self.table.lose(i, self.counters))
        resend: list[_Stream] = []
        woken: set[Hashable] = set()
        for stream in [s for s in self.streams.values() if s.replica == i and s.sent]:
            stream.attempts += 1
            stream.sent = False
            if stream.attempts >= self.max_attempts:
                error = replicas_lost(stream.attempts)
                woken.update(self._deliver(stream, ReplicaEvent(stream.stream_id, 0, error=error)))
                continue
            self.counters.resent_requests += 1
            self.table[i].live_streams -= 1
            commands += self._place(stream, avoid=i)
            resend.append(stream)
        commands += self._send(resend)
        if woken:
            commands.append(WakeChains(tuple(sorted(woken, key=repr))))
        return commands

    def replica_back(self, i: int) -> list[Command]:
        """Replica i answers again: the streams parked for it go now."""
        return self._send([s for s in self.streams.values() if s.replica == i and not s.sent])

    def fail_parked(self, message: str) -> list[Command]:
        """No replica came back: every stream waiting for one fails in its chains."""
        woken: set[Hashable] = set()
        for stream in [s for s in self.streams.values() if not s.sent]:
            woken.update(self._deliver(stream, ReplicaEvent(stream.stream_id, 0, error=message)))
        return [WakeChains(tuple(sorted(woken, key=repr)))] if woken else []

    def forget_replica(self, i: int) -> None:
        self.polled.discard(i)

    def running(self) -> int:
        return len(self.streams)

    # --- inside --------------------------------------------------------------------------------
    def _start(self, chain_id: Hashable, mailbox: _Mailbox, starts: Sequence) -> list[Command]:
        self.counters.submitted_requests += len(starts)
        new: list[_Stream] = []
        commands: list[Command] = []
        for start in starts:
            stream = self.by_request.get(start.request)
            if stream is not None:
                self.counters.deduplicated += 1
            else:
                stream = _Stream((self.epoch, next(self._ids)), start.request, start.priority, -1)
                self.streams[stream.stream_id] = self.by_request[start.request] = stream
                commands += self._place(stream)
                new.append(stream)
            stream.subscribers.add((chain_id, start.key))
            mailbox.subscriptions[start.key] = stream
        self.counters.streamed_requests += len(new)
        return commands + self._send(new)

    def _place(self, stream: _Stream, avoid: int | None = None) -> list[Command]:
        target, missed = self.table.choose(stream.request, lambda i: self.table[i].live_streams, avoid)
        self.counters.affinity_misses += missed
        stream.replica = target
        self.table[target].live_streams += 1
        if target in self.polled:
            return []
        self.polled.add(target)
        return [PollReplica(target)]

    def _send(self, streams: Iterable[_Stream]) -> list[Command]:
        """Start `streams` on their replicas; those whose replica is down stay parked."""
        by_replica: dict[int, list[ReplicaStart]] = defaultdict(list)
        for stream in streams:
            if self.table[stream.replica].healthy:
                stream.sent = True
                by_replica[stream.replica].append(stream.start())
        return [StartStreams(i, tuple(starts)) for i, starts in by_replica.items()]

    def _wake(self, mailbox: _Mailbox, wakes: Sequence[tuple[ProposalKey, int]]) -> list[Command]:
        by_replica: dict[int, list[tuple[StreamId, int]]] = defaultdict(list)
        for key, generated in wakes:
            stream = mailbox.subscriptions.get(key)
            if stream is not None and generated not in stream.wakes:
                stream.wakes.add(generated)
                if stream.sent:  # a parked stream takes its wakes along when it is sent
                    by_replica[stream.replica].append((stream.stream_id, generated))
        return [WakeStreams(i, tuple(batch)) for i, batch in by_replica.items()]

    def _bound(self, mailbox: _Mailbox, bounds: Sequence[tuple[ProposalKey, tuple[RejectionBound, ...]]]) -> list[Command]:
        """New early-rejection bounds from the stream's only subscriber. A stream several chains
        share keeps the bounds it started with: each chain checks a stopped completion itself."""
        by_replica: dict[int, list[tuple[StreamId, tuple[RejectionBound, ...]]]] = defaultdict(list)
        for key, new in bounds:
            stream = mailbox.subscriptions.get(key)
            if stream is None or len(stream.subscribers) > 1:
                continue
            stream.bounds = new
            if stream.sent:  # a parked stream takes its bounds along when it is sent
                by_replica[stream.replica].append((stream.stream_id, new))
        return [BoundStreams(i, tuple(batch)) for i, batch in by_replica.items()]

    def _unsubscribe(self, chain_id: Hashable, mailbox: _Mailbox, keys: Sequence[ProposalKey]) -> list[Command]:
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
        return [AbortStreams(i, tuple(batch)) for i, batch in aborts.items()]

    def _forget(self, stream: _Stream) -> None:
        del self.streams[stream.stream_id]
        self.by_request.pop(stream.request, None)
        self.table[stream.replica].live_streams -= 1

    def _deliver(self, stream: _Stream, event: ReplicaEvent) -> set[Hashable]:
        """`event` to every subscriber's mailbox; the chains it reached."""
        if event.ended:
            self._forget(stream)
        reached: set[Hashable] = set()
        for chain_id, key in stream.subscribers:
            mailbox = self.mailboxes.get(chain_id)
            if mailbox is None:
                continue
            if event.ended:
                mailbox.subscriptions.pop(key, None)
            mailbox.events.append(ChainEvent(key, event.generated, event.partial, event.completion, event.error))
            reached.add(chain_id)
        return reached
