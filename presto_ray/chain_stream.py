"""The streaming schedule's book: a chain's running requests, walked the moment they land.

    stream = ChainStream(chain)
    actions = stream.step()                  # start: what to start, wake and abort
    actions = stream.step(events, budget)    # each batch of events for the chain, until actions.done

`step` is the book's one entry: it takes the events that landed (completions, fork points
reached, errors), walks each completion, and returns what the driver must carry out; the order
in which a chain delivers events, drops dead requests, plans and updates bounds lives here, so no
driver can get it wrong. Both streaming drivers (presto_ray/streaming.py in process,
actors/chain_driver.py over Ray) only carry out `StreamActions` (docs/streaming.md).

The book owns the chain's requests: those running (with the tokens they have so far and the
bounds they carry), the completions the walk has not consumed yet, and the fork points it asked
to be woken at. The plan is rebuilt only when something it depends on changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, cast

from presto_ray.chain import Chain, ProposalKey
from presto_ray.early_rejection import RejectionBound
from presto_ray.engines.base import Completion, ProposalRequest
from presto_ray.plan_tree import PlanTree, RequestKey
from presto_ray.proposal_book import ProposalBook
from presto_ray.selection import SearchWalks, fork_points_worth_waking, reach_probabilities
from presto_ray.speculation import speculation_threshold


class RequestEvent(Protocol):
    """What happened to one of the chain's running requests: it ended (`completion` or `error`)
    or reached a fork point (`partial`: its tokens so far)."""

    @property
    def key(self) -> ProposalKey: ...

    @property
    def partial(self) -> tuple[int, ...] | None: ...

    @property
    def completion(self) -> Completion | None: ...

    @property
    def error(self) -> str | None: ...


@dataclass(frozen=True)
class StreamEvent:
    """A RequestEvent built by an in-process driver."""

    key: ProposalKey
    partial: tuple[int, ...] | None = None
    completion: Completion | None = None
    error: str | None = None


@dataclass(frozen=True)
class StartRequest:
    """A request the chain wants running now. `priority`: lower runs first; 0 for the request the
    walk needs next, else 1 - the probability that the walk uses it."""

    key: ProposalKey
    request: ProposalRequest
    priority: float


@dataclass(frozen=True)
class StreamActions:
    """What the driver must do after a step. `done`: the chain is finished (its remaining requests
    are in `aborts`; nothing starts); `transitions`: MH transitions the step's events completed."""

    aborts: tuple[ProposalKey, ...]
    starts: tuple[StartRequest, ...]
    wakes: tuple[tuple[ProposalKey, int], ...]  # (running request, token count that unlocks a fork)
    done: bool
    transitions: int
    bounds: tuple[tuple[ProposalKey, tuple[RejectionBound, ...]], ...] = ()  # running request -> its new rejection bounds


class StreamRequestError(RuntimeError):
    """An engine refused or lost one of a streaming chain's requests."""


class ChainStream(ProposalBook):
    """A chain's side of the streaming schedule. Call `step()` once with no events to start, then
    with each batch of events for the chain until `done`."""

    def __init__(self, chain: Chain) -> None:
        super().__init__(chain)
        self._running: dict[ProposalKey, None] = {}  # started, neither completed nor dropped (in start order)
        self._completed: dict[ProposalKey, Completion] = {}  # completions the walk has not consumed
        self._partial: dict[ProposalKey, tuple[int, ...]] = {}  # tokens of running proposals, at fork points
        self._sent_bounds: dict[ProposalKey, tuple[RejectionBound, ...]] = {}  # what each running request carries
        self._woken: dict[ProposalKey, set[int]] = {}  # fork points asked for, per running request
        self._tree: PlanTree | None = None  # the plan from the current state and knowledge
        # what the plan knows of each proposal, by its first try (MultiTryMH plans none below an
        # accept): its tokens so far and whether it ended; which ended by early rejection; and
        # which requests' knowledge changed since the last plan (the cache diffs only those)
        self._known: dict[RequestKey, tuple[tuple[int, ...], bool]] = {}
        self._stopped_early: set[RequestKey] = set()
        self._touched: dict[RequestKey, None] = {}
        # the last selection's walks, with the tree they walked: while that tree is the plan
        # (nothing started since), the fork-point pass reads them
        self._last_search: tuple[PlanTree, SearchWalks] | None = None

    @property
    def running_requests(self) -> int:
        return len(self._running)

    def is_running(self, key: ProposalKey) -> bool:
        """`key` was started and has neither completed nor been dropped as useless."""
        return key in self._running

    def step(self, events: Iterable[RequestEvent] = (), budget: int | None = None) -> StreamActions:
        """Deliver `events` in order, then plan: `budget` caps the requests kept running (None:
        the chain's `prefetch_budget`; drivers lower it under load, presto_ray/speculation.py)."""
        transitions = 0
        for event in events:
            if event.key not in self._running:
                continue  # dropped by the chain after the event left its engine
            if event.error is not None:
                raise StreamRequestError(event.error)
            if event.completion is not None:
                transitions += self._complete(event.key, event.completion)
            else:
                tokens = self._partial[event.key] = tuple(event.partial or ())
                self._know(event.key, (tokens, False))
                self._tree = None
        aborts = tuple(self._drop_useless())
        if self.chain.done:
            self._tree = None
            self.planner.release_plans()  # freed now, not by a cyclic collection
            return StreamActions(aborts, (), (), True, transitions)
        starts = tuple(self._start(budget))
        return StreamActions(aborts, starts, self._wakes(), False, transitions, self._bound_updates())

    # --- the step's parts, in its order ---------------------------------------------------
    def _complete(self, key: ProposalKey, completion: Completion) -> int:
        """A running request ended: walk as far as the realized path allows; its transitions."""
        del self._running[key]
        self._forget(key)
        self._completed[key] = completion
        # a stopped proposal's tokens are the full one's first tokens; its end is unknown
        self._know(key, (completion.token_ids, not completion.stopped_early), completion.stopped_early)
        self._count_completed(key, completion)
        report = self._walked(self.chain.walk(self._completed.get))
        for used in report.used:
            del self._completed[used]
            self._know(used, None)
        if report.unusable is not None and self._completed.pop(report.unusable, None) is not None:
            self._know(report.unusable, None)  # asked again, without bounds, by the next start
        self._tree = None
        return report.transitions

    def _drop_useless(self) -> list[ProposalKey]:
        """Running requests no reachable node can use any more: the chain forgets them."""
        needed = set() if self.chain.done else self._plan().keys
        useless = [key for key in self._running if key[:2] not in needed]
        for key in useless:
            del self._running[key]
            self._forget(key)
            self._know(key, None)
        for key in [key for key in self._completed if key[:2] not in needed]:
            del self._completed[key]
            self._know(key, None)
        self.chain.stats.aborted_requests += len(useless)
        return useless

    def _start(self, budget: int | None) -> list[StartRequest]:
        """Requests to start now, needed first: the root's when it is not running, then the most
        probable ones, while fewer than `budget` requests run (default and cap: `prefetch_budget`).
        Predictive: a speculative request must add `speculation_threshold` expected completed
        transitions (or `min_expected_gain`, the larger)."""
        budget = self._within_budget(budget)
        tree = self._plan()
        issued = self._issued()
        walk = SearchWalks(tree.root, issued)
        keys = self.planner.select(tree, budget - len(self._running), issued, self._min_gain(), walk)
        if not keys:
            self._last_search = (tree, walk)
            return []
        reach = reach_probabilities(tree.root, issued | set(keys), walk)
        starts = []
        for key in keys:
            priority = 0.0 if key == tree.root.key else 1.0 - reach[key]
            for i, request in enumerate(self.planner.requests(key, tree)):
                starts.append(StartRequest((*key, i), request, priority))
                self._running[(*key, i)] = None
                self._know((*key, i), ((), False))
                self._sent_bounds[(*key, i)] = request.rejection_bounds
        stats = self.chain.stats
        stats.stream_batches += 1
        stats.forked_requests += sum(key in tree.forks for key in keys)
        self._count_issued([start.request for start in starts])
        self._tree = None
        return starts

    def _wakes(self) -> tuple[tuple[ProposalKey, int], ...]:
        """Running proposal -> the token count that unlocks a request deferred on it, each asked once.
        Predictive: only fork points whose request could pass the selection's minimum gain now
        (most do not: each fork point is an event and a plan); one that becomes worth it later is
        asked then, and an engine past it already answers at once (base.StreamingEngine.wake_at)."""
        tree = self._plan()
        fork_points = tree.fork_points
        config = self.chain.config
        min_reach = config.fork_wake_share * self._min_gain() if config.traversal == "predictive" else 0.0
        last_search, self._last_search = self._last_search, None
        if fork_points and min_reach > 0.0:
            walk = last_search[1] if last_search is not None and last_search[0] is tree else None
            issued = self._issued()
            fork_points = cast(dict[RequestKey, int], fork_points_worth_waking(tree.root, issued, min_reach, walk))
        wakes = []
        for key, needed in fork_points.items():
            stream_key = (*key, 0)
            if stream_key not in self._running:
                continue
            asked = self._woken.setdefault(stream_key, set())
            if needed not in asked:
                asked.add(needed)
                wakes.append((stream_key, needed))
        return tuple(wakes)

    def _bound_updates(self) -> tuple[tuple[ProposalKey, tuple[RejectionBound, ...]], ...]:
        """Running requests whose bounds the walk changed: the new set for each (the bounds of
        the nodes in the current state that use it; empty: run to the end). A request started
        below an unfinished accept edge carries none; once the walk accepts that edge, its node
        is in the chain's state and its bound is known, so the engine may stop it early."""
        tree = self._plan()
        updates = []
        for key, sent in self._sent_bounds.items():
            wanted = self.planner.bounds(key[:2], tree)
            if wanted != sent:
                updates.append((key, wanted))
        for key, bounds in updates:
            self._sent_bounds[key] = bounds
        return tuple(updates)

    def _issued(self) -> set[RequestKey]:
        """Requests running or finished and not consumed: the plan counts them as issued."""
        return {key[:2] for key in (*self._running, *self._completed)}

    def _min_gain(self) -> float:
        """Expected completed transitions a speculative request must add (predictive selection)."""
        config = self.chain.config
        return max(config.min_expected_gain, speculation_threshold(config.prefetch_budget, config.speculation_gain))

    # --- what the plan knows ----------------------------------------------------------------
    def _plan(self) -> PlanTree:
        if self._tree is None:
            touched, self._touched = self._touched, {}
            self._tree = self.planner.tree(self._known, self._stopped_early, touched)
        return self._tree

    def _forget(self, key: ProposalKey) -> None:
        self._partial.pop(key, None)
        self._sent_bounds.pop(key, None)
        self._woken.pop(key, None)

    def _know(self, key: ProposalKey, info: tuple[tuple[int, ...], bool] | None, stopped_early: bool = False) -> None:
        """What the plan knows of `key`'s proposal now (None: nothing; it is neither running nor
        held): kept by its first try only."""
        if key[2] != 0:
            return
        request = key[:2]
        if info is None:
            del self._known[request]
        else:
            self._known[request] = info
        if stopped_early:
            self._stopped_early.add(request)
        else:
            self._stopped_early.discard(request)
        self._touched[request] = None
