"""Which chains the coordinator waits for: active, waiting on a submit, finished, expired. Pure: no
Ray, no asyncio; time is passed in (seconds on any clock).

"Every active chain has planned" releases a round (actors/batching.py), so a chain wrongly left
active holds every later round to the batch window. A chain stops being active when it finishes,
when its caller is cancelled, or when it has been silent for `idle_timeout_s` with no submit
waiting and no open stream (its driver vanished without a word); its next call makes it active again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

from actors.coordinator_stats import CoordinatorCounters

# Finished chain ids remembered to ignore their late submits (see ChainBook.finished).
FINISHED_CHAINS_KEPT = 65_536


class ChainBook:
    """The chains' lifecycle, counted into the coordinator's `counters`."""

    def __init__(self, idle_timeout_s: float, counters: CoordinatorCounters, finished_kept: int = FINISHED_CHAINS_KEPT) -> None:
        self.idle_timeout_s, self.counters, self.finished_kept = idle_timeout_s, counters, finished_kept
        self.active: set[Hashable] = set()
        # an async actor may run one caller's calls out of order, so a submit that lands after its
        # chain_finished (a cancelled request) must not register the chain again, or "every chain
        # has planned" would never hold (bounded: the oldest go)
        self.finished: OrderedDict[Hashable, None] = OrderedDict()
        self.waiting: dict[Hashable, int] = {}  # submits in flight per chain
        self.last_call: dict[Hashable, float] = {}
        self.next_scan = 0.0

    def activate(self, chain_id: Hashable, now: float) -> bool:
        """The chain calls (or is announced); True when it is the only active chain now."""
        self.active.add(chain_id)
        self.last_call[chain_id] = now
        return len(self.active) == 1

    def reopen(self, chain_id: Hashable, now: float) -> bool:
        """A replayed chain starts again, even after it finished."""
        self.finished.pop(chain_id, None)
        return self.activate(chain_id, now)

    def begin_wait(self, chain_id: Hashable) -> None:
        self.waiting[chain_id] = self.waiting.get(chain_id, 0) + 1

    def end_wait(self, chain_id: Hashable, now: float) -> None:
        self.waiting[chain_id] -= 1
        if not self.waiting[chain_id]:
            del self.waiting[chain_id]
        if chain_id in self.active:
            self.last_call[chain_id] = now

    def finish(self, chain_id: Hashable) -> bool:
        """The chain is over; False when it was already (said twice: by a cancelled caller and its driver)."""
        if chain_id in self.finished:
            return False
        self.active.discard(chain_id)
        self.last_call.pop(chain_id, None)
        self.finished[chain_id] = None
        if len(self.finished) > self.finished_kept:
            self.finished.popitem(last=False)
        self.counters.chains_finished += 1
        return True

    def all_planned(self) -> bool:
        # waiting is a subset of active (submit adds a chain to both), so counting suffices
        return len(self.waiting) >= len(self.active)

    def expire_silent(self, now: float, streaming: Callable[[Hashable], bool]) -> int:
        """Drop active chains silent past `idle_timeout_s` with no submit waiting and no open
        stream (`streaming`); at most one scan a second. How many expired."""
        if now < self.next_scan:
            return 0
        self.next_scan = now + min(1.0, self.idle_timeout_s / 4)
        limit = now - self.idle_timeout_s
        silent = [
            c for c in self.active
            if self.last_call.get(c, now) < limit and c not in self.waiting and not streaming(c)
        ]  # fmt: skip
        for chain_id in silent:
            self.active.discard(chain_id)
            self.last_call.pop(chain_id, None)
        self.counters.chains_expired += len(silent)
        return len(silent)

    def next_deadline(self) -> float | None:
        """When the next silent-chain scan is due (None: no active chain to scan)."""
        return self.next_scan if self.active else None
