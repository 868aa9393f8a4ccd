"""Building the planning DAG of a prefetch round (docs/algorithm.md, section 4).

Tree nodes that share the facts that decide their future requests are merged into one class:
(known: the leading tokens the state certainly holds, length: the state's length, exact or
guessed, whole_known: the state is exactly `known`). Below an accept edge with cut c the known
part shrinks to the first c tokens (Condition 1), then grows by whatever the accepted proposal
has generated so far: nothing in rounds, its finished tokens or a prefix of them when streaming
(docs/streaming.md). A step whose cut lies beyond the known part is deferred; when the
part it waits for is a proposal still being generated, the tree records a fork point: how many
of that proposal's tokens the step needs, and the step is pending: its request will start at the
fork point, so the tree goes on below it (both branches; the accept branch's known part is the
same, the source's tokens holding only up to the step's cut). Steps further on whose cut falls
in the known part get requests now: in fixed-length mode that is the common case (a later step
with an earlier cut has the same prefix on every path), and starting it while the walk still
waits above it is what lets a streaming chain finish near the time plain decoding would.

Lengths: in fixed-length mode every length is exact. In EOS-aware mode the length of a state
below an accepted proposal is unknown until the proposal exists; the planner guesses that a
proposal ends where the state it replaces ended. A wrong guess only wastes a request: the walk
looks requests up by the realized (step, prefix) and stops at the first miss, so the law is
never affected.

Exact early rejection (docs/samplers.md): the tree names the keys that nodes in the root's own
state use (the root and every node below reject edges only), the nodes whose bound the chain
knows at plan time; and a node in the root's state whose request was stopped early has no accept
branch (its rejection is certain).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Callable, Mapping, NamedTuple

from presto_ray.schedule import Event, Schedule
from presto_ray.selection import PlanNode

RequestKey = tuple[int, tuple[int, ...]]  # (event index, prefix tokens)

# What is known of each running or finished proposal: (its tokens so far, whether it has ended).
ProposalKnowledge = Mapping[RequestKey, "tuple[tuple[int, ...], bool]"]
# The requests whose proposal was stopped by early rejection (their root-state nodes reject).
StoppedEarly = AbstractSet[RequestKey]

# Deeper than this a round never plans: reach probabilities are negligible long before.
MAX_PLAN_DEPTH = 256


class _Facts(NamedTuple):  # a tuple: hashed and compared in C, a tree hashes thousands per build
    known: tuple[int, ...]
    length: int
    whole_known: bool
    source: RequestKey | None = None  # the unfinished proposal that `known` ends with
    source_start: int = 0  # where that proposal's tokens begin in `known`
    # below a pending step's accept edge: the source's tokens hold only up to that step's cut
    # (a new proposal follows); None: to the state's end
    source_end: int | None = None


@dataclass
class PlanTree:
    root: PlanNode
    keys: set[RequestKey]  # every key some node of the tree needs
    fork_points: dict[RequestKey, int]  # unfinished proposal -> its token count that unlocks a deferred step
    forks: set[RequestKey]  # keys whose prefix holds tokens of a proposal still being generated
    root_state_keys: set[RequestKey]  # keys nodes in the root's state need (their bound is known at plan time)
    max_value: float = 1.0  # the largest node value (0 when every node is free): selection's bound


class _Expansion(NamedTuple):
    """What one node of a tree is, given its facts, as far as a later tree from the same root can
    reuse it: its request, flags and children's facts, and what it read of the stream's knowledge
    (`info`: the knowledge of its own request; `stopped`: whether that request was stopped early)."""

    key: RequestKey | None
    free: bool
    pending: bool
    fork: tuple[RequestKey, int] | None  # (running proposal, its token count that unlocks this step)
    is_fork: bool  # its prefix holds tokens of a proposal still being generated
    branches: tuple[tuple[_Facts, float], ...]
    info: object
    stopped: bool


_UNREAD = object()  # an expansion that read no knowledge


class PlanCache:
    """Expansions of earlier trees' nodes, by (depth, facts), kept while the trees share a root
    (the walk has not moved) and the predictor has not refitted. A streaming chain rebuilds its
    tree at every event, and most events change the knowledge of one request only, so most nodes
    expand as before: a reused expansion is checked against what it read, never trusted blindly."""

    def __init__(self) -> None:
        self._root: tuple[object, int, int] | None = None
        self._expansions: dict[tuple[int, _Facts], _Expansion] = {}

    def for_root(self, state: object, event_index: int, version: int) -> dict[tuple[int, _Facts], _Expansion]:
        """The expansions for trees from `state` (compared by identity) at `event_index`;
        `version`: anything else they read that may change (the predictor's fits)."""
        root = (state, event_index, version)
        if self._root is None or self._root[0] is not state or self._root[1:] != root[1:]:
            self._root, self._expansions = root, {}
        return self._expansions


def build_plan_tree(
    tokens: tuple[int, ...],
    event_index: int,
    schedule: Schedule,
    *,
    fixed_length: bool,
    stop_at_eos: bool,
    eos_token_id: int | None,
    cut_for: Callable[[int, int], int | None],
    accept_branch_probability: Callable[[int, float], float],
    max_keyed_depth: int,
    requests_per_step: int = 1,
    proposal: ProposalKnowledge | None = None,
    stopped_early: StoppedEarly | None = None,
    cache: dict[tuple[int, _Facts], _Expansion] | None = None,
) -> PlanTree:
    """The DAG of future events from the realized state `tokens` at event `event_index`.

    `cut_for(step, length)` is the cut of MH step `step` for a state of `length` tokens whose
    known part is the root's (None when it cannot be told now). `proposal[key]` tells what is
    known of a request's proposal (streaming); without it nothing below an accept edge is.
    `cache`: `PlanCache.for_root(state, event_index, ...)`, whose expansions this tree reuses
    and extends (the same tree as without it).
    """

    def ends_with_eos(facts: _Facts) -> bool:
        known = facts.known
        return facts.whole_known and not fixed_length and eos_token_id is not None and bool(known) and known[-1] == eos_token_id

    def accepted(facts: _Facts, key: RequestKey, cut: int, guessed_length: int, info: tuple[tuple[int, ...], bool] | None) -> _Facts:
        """The state after `key`'s proposal replaced everything from `cut` on."""
        generated, ended = info if info is not None else ((), False)
        known = facts.known[:cut] + generated
        if ended:
            return _Facts(known, len(known), True)
        if info is None:
            return _Facts(known, guessed_length, False)
        return _Facts(known, guessed_length, False, source=key, source_start=cut)

    def expand(depth: int, event: Event, facts: _Facts) -> _Expansion | None:
        """The node of `facts` at `depth` (None: dead, nothing below it is planned)."""
        key: RequestKey | None = None
        info: object = _UNREAD
        stopped = False
        fork = None
        is_fork = free = pending = False
        if event.is_extension:
            if not facts.whole_known:
                return None  # the whole state is the prefix: unknown below a generation
            if facts.length >= event.horizon or ends_with_eos(facts):
                free = True
                branches = [(facts, 1.0)]
            else:
                key = (event.index, facts.known)
                info = proposal.get(key) if proposal is not None else None
                branches = [(accepted(facts, key, facts.length, event.horizon, info), 1.0)]
        else:
            cut = cut_for(event.step, facts.length)
            if cut is None:
                return None  # cannot be told now
            h_accept = accept_branch_probability(event.step, cut / event.horizon)
            if cut > len(facts.known):  # deferred: its prefix holds tokens not generated yet
                source = facts.source
                if source is None or (facts.source_end is not None and cut > facts.source_end):
                    return None  # nobody is generating them
                # a fork once the source has these tokens; until then the step is pending and
                # the walk's future beyond it is planned (requests whose prefix exists may start)
                fork = (source, cut - facts.source_start)
                pending = True
                after_accept = _Facts(facts.known, facts.length, False, source, facts.source_start, source_end=cut)
                branches = [(after_accept, h_accept), (facts, 1.0 - h_accept)]
            else:
                key = (event.index, facts.known[:cut])
                is_fork = facts.source is not None and cut > facts.source_start
                stopped = facts == root_facts and stopped_early is not None and key in stopped_early
                if stopped:
                    branches = [(facts, 1.0)]  # rejection is certain: no accept branch
                else:
                    # guess: an unfinished proposal ends where the state it replaces ended
                    info = proposal.get(key) if proposal is not None else None
                    branches = [(accepted(facts, key, cut, facts.length, info), h_accept), (facts, 1.0 - h_accept)]
        if depth + 1 >= max_depth:
            branches = []
        elif event.ends_block and stop_at_eos:
            branches = [(child, p) for child, p in branches if not ends_with_eos(child)]
        return _Expansion(key, free, pending, fork, is_fork, tuple(branches), info, stopped)

    def still_holds(expansion: _Expansion, facts: _Facts) -> bool:
        """Whether a cached expansion read the knowledge this tree has."""
        key = expansion.key
        if key is None:
            return True
        if expansion.info is not _UNREAD and expansion.info != (proposal.get(key) if proposal is not None else None):
            return False
        if facts == root_facts and stopped_early is not None and (key in stopped_early) != expansion.stopped:
            return False
        return True

    root = PlanNode(depth=0)
    tree = PlanTree(root, set(), {}, set(), set())
    root_facts = _Facts(tuple(tokens), len(tokens), True)
    level: dict[_Facts, PlanNode] = {root_facts: root}
    keyed_depths = 0
    nodes, free_nodes = 1, 0
    max_depth = min(MAX_PLAN_DEPTH, schedule.num_events - event_index)
    expansions = {} if cache is None else cache
    for depth in range(max_depth):
        if not level or keyed_depths >= max_keyed_depth:
            break
        event = schedule.event(event_index + depth)
        following: dict[_Facts, PlanNode] = {}
        any_keyed = False
        for facts, node in level.items():
            memo_key = (depth, facts)
            expansion = expansions.get(memo_key)
            if expansion is None or not still_holds(expansion, facts):
                expansion = expand(depth, event, facts)
                if expansion is None:
                    continue
                expansions[memo_key] = expansion
            key = expansion.key
            if expansion.free:
                node.free, node.value = True, 0.0
                free_nodes += 1
            if expansion.pending:
                node.pending = True
                source, needed = expansion.fork  # type: ignore[misc]
                tree.fork_points[source] = min(needed, tree.fork_points.get(source, needed))
            if key is not None:
                node.key = key
                if not event.is_extension:
                    node.cost = requests_per_step
                if expansion.is_fork:
                    tree.forks.add(key)
                tree.keys.add(key)
                if facts == root_facts:
                    tree.root_state_keys.add(key)
                any_keyed = True
            for child_facts, probability in expansion.branches:
                child = following.get(child_facts)
                if child is None:
                    child = following[child_facts] = PlanNode(depth=depth + 1)
                    nodes += 1
                node.children.append((child, probability))
        keyed_depths += any_keyed
        level = following
    tree.max_value = 1.0 if nodes > free_nodes else 0.0
    return tree
