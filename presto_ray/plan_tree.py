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

Incremental trees, and a tree built from nothing: presto_ray/plan_cache.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Callable, Mapping, NamedTuple

from presto_ray.schedule import Event, Schedule
from presto_ray.selection import PlanNode

RequestKey = tuple[int, tuple[int, ...]]  # (event index, prefix tokens)


class TokenRun(tuple[int, ...]):
    """Tokens that hash once. A plan hashes its prefixes and keys at every node of every tree, and
    a prefix is as long as the horizon: a plain tuple hashes all its tokens each time. It equals
    and hashes as the plain tuple of the same tokens, so plain and cached keys mix in any dict;
    its slices and sums are plain tuples."""

    _hash: int

    def __new__(cls, tokens: tuple[int, ...]) -> "TokenRun":
        run = super().__new__(cls, tokens)
        run._hash = tuple.__hash__(run)
        return run

    def __hash__(self) -> int:
        return self._hash


# What is known of each running or finished proposal: (its tokens so far, whether it has ended).
ProposalKnowledge = Mapping[RequestKey, "tuple[tuple[int, ...], bool]"]
# The requests whose proposal was stopped by early rejection (their root-state nodes reject).
StoppedEarly = AbstractSet[RequestKey]

# Deeper than this a round never plans: reach probabilities are negligible long before.
MAX_PLAN_DEPTH = 256


class _Facts(NamedTuple):  # a tuple: hashed and compared in C, a tree hashes thousands per build
    # the leading tokens the state certainly holds; with a source, those before its tokens (the
    # source's tokens so far follow them: read from the knowledge, so a proposal that grows
    # leaves the facts, and the nodes, below it as they are)
    known: tuple[int, ...]
    length: int
    whole_known: bool
    source: RequestKey | None = None  # the unfinished proposal (running or only planned) whose tokens follow `known`
    source_start: int = 0  # where that proposal's tokens begin (len(known) with a source)
    # below a pending step's accept edge: the source's tokens hold only up to that step's cut
    # (a new proposal follows); None: to the state's end
    source_end: int | None = None


def _source_tokens(facts: _Facts, proposal: ProposalKnowledge) -> tuple[int, ...]:
    """The tokens of `facts`' source that its state holds (after `facts.known`)."""
    info = proposal.get(facts.source)  # type: ignore[arg-type]
    if info is None:
        return ()
    generated = info[0]
    end = facts.source_end
    return generated if end is None else generated[: end - facts.source_start]


@dataclass
class PlanTree:
    """A plan. Its nodes and key sets are the cache's (its sets are views of its counts, not
    copies: a tree hashes ~100 keys per copy): valid until the planner's next tree."""

    root: PlanNode
    keys: AbstractSet[RequestKey]  # every key some node of the tree needs
    fork_points: dict[RequestKey, int]  # unfinished proposal -> its token count that unlocks a deferred step
    forks: AbstractSet[RequestKey]  # keys whose prefix holds tokens of a proposal still being generated
    root_state_keys: AbstractSet[RequestKey]  # keys nodes in the root's state need (their bound is known at plan time)
    max_value: float = 1.0  # the largest node value (0 when every node is free): selection's bound


class _Expansion(NamedTuple):
    """What one node is, given its facts and the knowledge it read: its request, flags and
    children's facts."""

    key: RequestKey | None
    free: bool
    pending: bool
    fork: tuple[RequestKey, int] | None  # (running proposal, its token count that unlocks this step)
    is_fork: bool  # its prefix holds tokens of a proposal still being generated
    branches: tuple[tuple[_Facts, float], ...]


@dataclass(frozen=True)
class PlanRules:
    """How a node expands: the chain's settings and its planner's cut and branch laws.
    `cut_for(step, length)` is the cut of MH step `step` for a state of `length` tokens whose
    known part is the root's (None when it cannot be told now)."""

    schedule: Schedule
    fixed_length: bool
    stop_at_eos: bool
    eos_token_id: int | None
    cut_for: Callable[[int, int], "int | None"]
    accept_branch_probability: Callable[[int, float], float]
    requests_per_step: int = 1

    def ends_with_eos(self, facts: _Facts) -> bool:
        known = facts.known
        return facts.whole_known and not self.fixed_length and self.eos_token_id is not None and bool(known) and known[-1] == self.eos_token_id

    def expand(
        self, event: Event, facts: _Facts, last: bool, at_root: bool, proposal: ProposalKnowledge, stopped_early: StoppedEarly
    ) -> _Expansion | None:
        """The node of `facts` at `event` (None: dead, nothing below it is planned); `last`: the
        deepest planned event (no children); `at_root`: `facts` are the root's."""
        key: RequestKey | None = None
        fork = None
        is_fork = free = pending = False
        if event.is_extension:
            if not facts.whole_known:
                return None  # the whole state is the prefix: unknown below a generation
            if facts.length >= event.horizon or self.ends_with_eos(facts):
                free = True
                branches = [(facts, 1.0)]
            else:
                key = (event.index, facts.known)
                branches = [(_accepted(facts.known, key, facts.length, event.horizon, proposal.get(key)), 1.0)]
        else:
            cut = self.cut_for(event.step, facts.length)
            if cut is None:
                return None  # cannot be told now
            h_accept = self.accept_branch_probability(event.step, cut / event.horizon)
            source = facts.source
            known_part = facts.known
            if source is not None and cut > facts.source_start:
                known_part = facts.known + _source_tokens(facts, proposal)
            if cut > len(known_part):  # deferred: its prefix holds tokens not generated yet
                if source is None or source not in proposal or (facts.source_end is not None and cut > facts.source_end):
                    return None  # nobody is generating them (a source planned, not started, is not)
                # a fork once the source has these tokens; until then the step is pending and
                # the walk's future beyond it is planned (requests whose prefix exists may start)
                fork = (source, cut - facts.source_start)
                pending = True
                after_accept = _Facts(facts.known, facts.length, False, source, facts.source_start, source_end=cut)
                branches = [(after_accept, h_accept), (facts, 1.0 - h_accept)]
            else:
                key = (event.index, TokenRun(known_part[:cut]))
                is_fork = source is not None and cut > facts.source_start
                if at_root and key in stopped_early:
                    branches = [(facts, 1.0)]  # rejection is certain: no accept branch
                else:
                    # guess: an unfinished proposal ends where the state it replaces ended
                    info = proposal.get(key)
                    branches = [(_accepted(key[1], key, cut, facts.length, info), h_accept), (facts, 1.0 - h_accept)]
        if last:
            branches = []
        elif event.ends_block and self.stop_at_eos:
            branches = [(child, p) for child, p in branches if not self.ends_with_eos(child)]
        return _Expansion(key, free, pending, fork, is_fork, tuple(branches))


def _accepted(kept: tuple[int, ...], key: RequestKey, cut: int, guessed_length: int, info: tuple[tuple[int, ...], bool] | None) -> _Facts:
    """The state after `key`'s proposal replaced everything from `cut` on (`kept`: the state's
    first `cut` tokens). An unfinished proposal is the new state's source: its tokens so far are
    read from the knowledge where a node needs them."""
    if info is None or not info[1]:
        # the same facts whether the proposal runs or is only planned: a request that starts
        # leaves the nodes below its accept edge as they are but for those waiting for its tokens
        run = kept if type(kept) is TokenRun else TokenRun(kept)
        return _Facts(run, guessed_length, False, source=key, source_start=cut)
    known = TokenRun(kept + info[0])
    return _Facts(known, len(known), True)
