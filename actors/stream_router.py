"""The coordinator's streaming I/O (docs/streaming.md): carries out the stream book's commands
(actors/stream_book.py) on the replicas' stream methods (actors/engine_replica.py), long-polls each
replica's events, and parks each chain's `stream_exchange` until its mailbox has news.

The rules (dedup, subscribers, budgets, re-sends after a replica died) are the stream book's; this
class only talks to Ray: every `.remote()` of the streaming schedule is here, each Ray error
becomes a "replica lost" event for the book, and every task it starts is kept in the coordinator's
BackgroundTasks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

from ray import ObjectRef
from ray.exceptions import RayActorError

from actors.background_tasks import BackgroundTasks, outside_the_call
from actors.coordinator_commands import AbortStreams, BoundStreams, Command, PollReplica, StartStreams, WakeChains, WakeStreams
from actors.coordinator_core import CoordinatorCore
from actors.metrics import CoordinatorMetrics
from actors.stream_protocol import ChainActions, ChainUpdate

if TYPE_CHECKING:
    from actors.engine_replica import ReplicaHandle

# A replica's stream_events returns after this long even when nothing happened (idle polls are cheap).
POLL_TIMEOUT_S = 1.0
# How often a poller of a dead replica looks whether the probe has put it back.
DOWN_REPLICA_RECHECK_S = 0.2

StreamCommand = StartStreams | WakeStreams | BoundStreams | AbortStreams | PollReplica | WakeChains


class StreamRouter:
    """`replica(i)` is the handle of the replica at position i; `carry_out` runs commands that are
    not streams' (a lost replica's probe)."""

    def __init__(
        self,
        core: CoordinatorCore,
        replica: Callable[[int], ReplicaHandle],
        tasks: BackgroundTasks,
        metrics: CoordinatorMetrics,
        carry_out: Callable[[Sequence[Command]], None],
    ) -> None:
        self.core, self.book = core, core.streams
        self._replica, self._tasks, self._metrics, self._carry_out = replica, tasks, metrics, carry_out
        self._ready: dict[Hashable, asyncio.Event] = {}  # per open chain: its mailbox has news
        self._pollers: dict[int, asyncio.Task[None]] = {}

    # --- what chains call (through the coordinator) ---------------------------------------------
    async def open(self, chain_id: Hashable, prefetch_budget: int, now: float) -> int:
        """Start (or restart) the chain's mailbox; its first budget."""
        _, commands = self.core.stream_open(chain_id, prefetch_budget, now)
        self._carry_out(commands)  # closing a replayed chain's old mailbox wakes its old exchange
        self._ready[chain_id] = asyncio.Event()
        await self.free_batch()
        return self.book.budget(chain_id)

    async def exchange(self, chain_id: Hashable, actions: ChainActions) -> ChainUpdate:
        """Apply the chain's actions, then wait until at least one of its events has landed."""
        exchanged = self.book.exchange(chain_id, actions)  # StreamLost for a chain it does not know
        self._metrics.record_deduplicated(exchanged.deduplicated)
        starts = [c for c in exchanged.commands if isinstance(c, StartStreams)]
        self._carry_out([c for c in exchanged.commands if not isinstance(c, StartStreams)])
        # sent before this chain waits, and in background tasks (shielded): the starts may serve
        # other chains too, so a chain whose call is cancelled must not cancel them
        await asyncio.gather(*(asyncio.shield(self._tasks.spawn(self._start(c))) for c in starts))
        ready = self._ready.setdefault(chain_id, asyncio.Event())
        while (update := self.book.take_update(chain_id, exchanged.generation)) is None:
            ready.clear()
            await ready.wait()
        return update

    def forget_chain(self, chain_id: Hashable) -> None:
        """The chain's mailbox closed (its waiting exchange was woken already)."""
        if not self.book.has_mailbox(chain_id):
            self._ready.pop(chain_id, None)

    # --- commands ---------------------------------------------------------------------------------
    def carry_out(self, command: StreamCommand) -> None:
        if isinstance(command, StartStreams):
            self._tasks.spawn(self._start(command))
        elif isinstance(command, WakeStreams):
            self._metrics.streams.record_wakes(len(command.wakes))
            replica, wakes = self._replica(command.replica), list(command.wakes)
            self._fire(lambda: replica.stream_wake.remote(wakes))
        elif isinstance(command, BoundStreams):
            replica, bounds = self._replica(command.replica), list(command.bounds)
            self._fire(lambda: replica.stream_bounds.remote(bounds))
        elif isinstance(command, AbortStreams):
            self._metrics.streams.record_aborts(len(command.stream_ids))
            replica, stream_ids = self._replica(command.replica), list(command.stream_ids)
            self._fire(lambda: replica.stream_abort.remote(stream_ids))
        elif isinstance(command, PollReplica):
            if command.replica not in self._pollers:
                self._pollers[command.replica] = self._tasks.spawn(self._poll(command.replica))
        else:
            for chain_id in command.chain_ids:
                ready = self._ready.get(chain_id)
                if ready is not None:
                    ready.set()
        self._metrics.streams_running.set(self.book.running())

    async def _start(self, command: StartStreams) -> None:
        try:
            await self._replica(command.replica).stream_submit.remote(list(command.starts))
        except RayActorError:
            self._carry_out(self.book.replica_lost(command.replica))
            return
        self._metrics.streams.record_starts(len(command.starts))

    def _fire(self, call: Callable[[], ObjectRef[None]]) -> None:
        """Send without waiting: a lost replica shows up in its poller, which re-sends its streams.
        Sent now, outside the chain call being served: Ray cancels the calls a cancelled call made
        with it, and an abort, wake or bound serves every chain that shares the stream."""
        reference = outside_the_call().run(call)

        async def send() -> None:
            try:
                await reference
            except RayActorError:
                pass

        self._tasks.spawn(send())

    # --- events from replicas ---------------------------------------------------------------------
    async def _poll(self, i: int) -> None:
        while True:
            if not self.core.table[i].healthy:
                await asyncio.sleep(DOWN_REPLICA_RECHECK_S)  # the coordinator's probe marks it healthy again
                continue
            try:
                reply = await self._replica(i).stream_events.remote(self.book.epoch, POLL_TIMEOUT_S)
            except RayActorError:
                self._carry_out(self.book.replica_lost(i))
                continue
            self._carry_out(self.book.events_arrived(i, reply))
            self._metrics.engine.record(reply.accounting, self.core.accounting)

    def stop_polling(self, i: int) -> None:
        poller = self._pollers.pop(i, None)
        if poller is not None:
            poller.cancel()

    # --- the free batch budgets share -------------------------------------------------------------
    async def replicas_changed(self) -> None:
        """A replica joined or is retiring: the free batch is measured again once a stream has opened."""
        if self.book.free_batch is not None:
            self.book.free_batch = await self._measure_free_batch()

    async def free_batch(self) -> float:
        """The replicas' summed free batch: measured on first use, again when replicas change."""
        if self.book.free_batch is None:
            self.book.free_batch = await self._measure_free_batch()
        return self.book.free_batch

    async def _measure_free_batch(self) -> float:
        taking = [self._replica(i) for i in self.core.table.taking_work()]
        answers = await asyncio.gather(*(r.free_batch.remote() for r in taking), return_exceptions=True)
        return float(sum(a for a in answers if not isinstance(a, BaseException)))
