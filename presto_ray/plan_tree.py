"""Building the planning DAG of a prefetch round (ALGORITHM.md section 4).

Tree nodes that share the facts that decide their future requests are merged into one class:
(known_prefix: how many leading tokens are certainly the root's, length: the state's length, exact
or guessed, whole_known: the state is exactly the root's). Below an accept edge with cut c the
known prefix shrinks to c (Condition 1); a step whose cut lies beyond it is deferred.

Lengths: in fixed-length mode every length is exact. In EOS-aware mode the length of a state
below an accepted proposal is unknown until the proposal exists; the planner guesses that a
proposal ends where the state it replaces ended. A wrong guess only wastes a request: the walk
looks requests up by the realized (step, prefix) and stops at the first miss, so the law is
never affected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from presto_ray.schedule import Schedule
from presto_ray.selection import PlanNode

RequestKey = tuple[int, tuple[int, ...]]  # (event index, prefix tokens)

# Deeper than this a round never plans: reach probabilities are negligible long before.
MAX_PLAN_DEPTH = 256


@dataclass(frozen=True)
class _Facts:
    known_prefix: int
    length: int
    whole_known: bool


def build_plan_tree(
    tokens: tuple[int, ...],
    event_index: int,
    schedule: Schedule,
    *,
    fixed_length: bool,
    stop_at_eos: bool,
    eos_token_id: int | None,
    cut_for: Callable[[int, int], int | None],
    accept_branch_probability: Callable[[float], float],
    max_keyed_depth: int,
    requests_per_step: int = 1,
) -> PlanNode:
    """The DAG of future events from the realized state `tokens` at event `event_index`.

    `cut_for(step, length)` is the cut of MH step `step` for a state of `length` tokens whose
    known part is the root's (None when it cannot be told now).
    """
    ends_with_eos = (not fixed_length) and eos_token_id is not None and bool(tokens) and tokens[-1] == eos_token_id
    root = PlanNode(depth=0)
    level: dict[_Facts, PlanNode] = {_Facts(len(tokens), len(tokens), True): root}
    keyed_depths = 0
    max_depth = min(MAX_PLAN_DEPTH, schedule.num_events - event_index)
    for depth in range(max_depth):
        if not level or keyed_depths >= max_keyed_depth:
            break
        event = schedule.event(event_index + depth)
        following: dict[_Facts, PlanNode] = {}
        any_keyed = False
        for facts, node in level.items():
            if event.is_extension:
                if not facts.whole_known:
                    continue  # the whole state is the prefix: unknown below a generation
                if facts.length >= event.horizon or ends_with_eos:
                    node.free, node.value = True, 0.0
                    branches = [(facts, 1.0)]
                else:
                    node.key = (event.index, tokens[: facts.length])
                    branches = [(_Facts(facts.length, event.horizon, False), 1.0)]
            else:
                cut = cut_for(event.step, facts.length)
                if cut is None or cut > facts.known_prefix:
                    continue  # deferred: its prefix holds tokens not generated yet
                node.key = (event.index, tokens[:cut])
                node.cost = requests_per_step
                h_accept = accept_branch_probability(cut / event.horizon)
                accepted = _Facts(min(facts.known_prefix, cut), facts.length, False)
                branches = [(accepted, h_accept), (facts, 1.0 - h_accept)]
            any_keyed |= node.key is not None
            if depth + 1 >= max_depth:
                continue
            for child_facts, probability in branches:
                finished = event.ends_block and stop_at_eos and child_facts.whole_known and ends_with_eos
                if finished:
                    continue
                child = following.get(child_facts)
                if child is None:
                    child = following[child_facts] = PlanNode(depth=depth + 1)
                node.children.append((child, probability))
        keyed_depths += any_keyed
        level = following
    return root
