"""Choosing which proposal requests to issue in a round.

The input is a rooted planning DAG: each node is an event of the chain's future (the root is the
next event of the realized state). A node either needs a request (`key`), is `free` (completes
without one, e.g. a no-op extension), is `pending` (its request cannot be formed yet, but will be
once a running proposal reaches a fork point: streaming), or is dead (deferred with no such
promise).
Children carry branch probabilities. Several nodes may need the same key: one request serves all.

The walk completes a node when it is reached, all nodes above it on the realized path completed,
and its key was issued (or it is free). The expected number of completed events of a key set S is
therefore a forward propagation of probability mass, computed by `expected_completed`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import combinations
from typing import Hashable, Iterable, Iterator

# The exact search enumerates subsets of the distinct keys alive at one depth; the planner makes
# one or two per depth, so this cap only guards against pathological inputs.
MAX_KEYS_PER_DEPTH = 10
# Streaming trees can hold many keys per depth (finished and partial proposals make more states
# known); the search then stops after this many nodes and keeps the best set found so far. It
# explores larger subsets of the most probable keys first, so that set is the greedy one or better.
MAX_SEARCH_NODES = 20_000


@dataclass(eq=False, slots=True)
class PlanNode:
    depth: int
    key: Hashable | None = None
    free: bool = False
    # deferred on a running proposal's next tokens: its request starts at the fork point, so the
    # walk will pass it; the requests below it may start now (streaming only)
    pending: bool = False
    value: float = 1.0  # completed events this node counts for (free nodes count 0)
    cost: int = 1  # requests its key stands for (MultiTryMH: one per try)
    children: list[tuple["PlanNode", float]] = field(default_factory=list)
    # pending: (the running request whose tokens it waits for, how many of them unlock it)
    waits_for: tuple[Hashable, int] | None = None

    @property
    def passes_without_request(self) -> bool:
        """Free or pending: the walk passes it with no request of its own (it completes nothing now)."""
        return self.free or self.pending

    @property
    def dead(self) -> bool:
        return self.key is None and not self.passes_without_request


def _propagate(alive: dict[PlanNode, float], chosen: set) -> tuple[float, dict[PlanNode, float]]:
    """One depth of the walk: mass completed here and the mass reaching the next depth."""
    gain = 0.0
    reached: dict[PlanNode, float] = defaultdict(float)
    for node, mass in alive.items():
        if node.free or node.pending:  # passes_without_request, inlined: the hottest loop of a plan
            pass  # completes nothing now, passes its mass on
        elif node.key is not None and node.key in chosen:
            gain += mass * node.value
        else:
            continue
        for child, p in node.children:
            if p > 0.0:
                reached[child] += mass * p
    return gain, reached


def expected_completed(root: PlanNode, keys: Iterable[Hashable]) -> float:
    """Expected number of events the walk completes when exactly `keys` were generated."""
    chosen = set(keys)
    alive: dict[PlanNode, float] = {root: 1.0}
    total = 0.0
    while alive:
        gain, alive = _propagate(alive, chosen)
        total += gain
    return total


def reach_probabilities(root: PlanNode, keys: Iterable[Hashable], walk: "SearchWalks | None" = None) -> dict[Hashable, float]:
    """For each of `keys`, the probability that the walk reaches a node needing it, when all of
    `keys` are generated (the chance a request is used: its priority when streaming). `walk`: the
    walks of a search whose chosen keys, with the issued ones, are `keys`: the depths it walked
    through them are read instead of walked again (ignored when its root or keys differ)."""
    chosen = set(keys)
    recorded = walk.chosen_depths if walk is not None and walk.root is root and walk.chosen == chosen else []
    reach: dict[Hashable, float] = defaultdict(float)
    for alive in _depths(root, chosen, recorded):
        for node, mass in alive.items():
            if node.key in chosen:
                reach[node.key] += mass
    return {key: min(1.0, reach[key]) for key in chosen}


def _depths(root: PlanNode, chosen: set, recorded: list[dict[PlanNode, float]]) -> Iterator[dict[PlanNode, float]]:
    """The walk through `chosen` keys, depth by depth, until no mass is left: the `recorded`
    depths of a search first (when it recorded this walk), then `_propagate` on from the last."""
    alive = recorded[0] if recorded else {root: 1.0}
    depth = 0
    while alive:
        yield alive
        depth += 1
        alive = recorded[depth] if depth < len(recorded) else _propagate(alive, chosen)[1]


class SearchWalks:
    """Walks of the DAG that a selection's search makes and later passes over the same DAG repeat,
    depth by depth: each depth's nodes and the probability of reaching them (`_propagate`'s dicts,
    the same floats in the same order). `issued_depths`: through the issued requests alone (the
    search's branch that issues nothing new), read by the fork-point pass
    (`fork_points_worth_waking`); `chosen_depths`: through the issued requests and the ones the
    search chose (`chosen`), read by `reach_probabilities`. Each goes as far as the search went;
    a reader walks on from its last depth. A key is needed at one depth only (the planner's keys
    name their event, and a depth is an event), so the search's path to its best set, which adds
    keys depth by depth, is the walk through the whole set."""

    __slots__ = ("root", "issued", "issued_depths", "chosen", "chosen_depths")

    def __init__(self, root: PlanNode, issued: Iterable[Hashable]) -> None:
        self.root = root
        self.issued = set(issued)
        self.issued_depths: list[dict[PlanNode, float]] = [{root: 1.0}]
        self.chosen: set | None = None  # set by the search
        self.chosen_depths: list[dict[PlanNode, float]] = []


def fork_points_worth_waking(
    root: PlanNode, issued: Iterable[Hashable], min_reach: float, walk: SearchWalks | None = None
) -> dict[Hashable, int]:
    """For each running request that pending nodes wait for, the fewest of its tokens that unlock
    pending nodes the walk reaches with probability at least `min_reach` through `issued` requests
    alone (summed per depth and fork point: the nodes that will need one request). That reach is
    the mass the selection weighs such a request by once its prefix exists; below the selection's
    minimum gain the request is no candidate (`select_max_expected`), so its fork point is not
    worth an event now (presto_ray/chain_stream.py asks again at later steps, as reach grows).
    `walk`: a search's walks, whose issued depths are read (ignored when its root or issued set
    differ)."""
    chosen = set(issued)
    recorded = walk.issued_depths if walk is not None and walk.root is root and walk.issued == chosen else []
    worth: dict[Hashable, int] = {}
    for alive in _depths(root, chosen, recorded):
        waiting: dict[tuple[Hashable, int], float] = {}
        for node, mass in alive.items():
            if node.pending and node.waits_for is not None:
                waiting[node.waits_for] = waiting.get(node.waits_for, 0.0) + mass
        for (source, needed), mass in waiting.items():
            if mass >= min_reach and needed < worth.get(source, needed + 1):
                worth[source] = needed
    return worth


def select_breadth_first(root: PlanNode, budget: int, issued: Iterable[Hashable] = ()) -> list[Hashable]:
    """New keys in breadth-first order over the nodes reachable through issued keys (costs <= budget).

    `issued`: keys already generated or running; they pass through for free and are not returned.
    """
    chosen: list[Hashable] = []
    chosen_set: set = set(issued)
    spent = 0
    frontier = [root]
    while frontier:
        following: dict[PlanNode, None] = {}
        for node in frontier:
            if node.dead:
                continue
            if node.key is not None and not node.free and node.key not in chosen_set:
                if spent + node.cost > budget:
                    continue
                chosen.append(node.key)
                chosen_set.add(node.key)
                spent += node.cost
            for child, _ in node.children:
                following[child] = None
        frontier = list(following)
    return chosen


def _max_node_value(root: PlanNode) -> float:
    seen, stack, best = set(), [root], 0.0
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        best = max(best, node.value)
        stack.extend(child for child, _ in node.children)
    return best


def select_max_expected(
    root: PlanNode,
    budget: int,
    cost_per_request: float = 0.0,
    issued: Iterable[Hashable] = (),
    max_value: float | None = None,
    walk: SearchWalks | None = None,
) -> list[Hashable]:
    """New keys maximising expected completed events minus `cost_per_request` per request, within budget.

    Budget and cost count requests: a key costs its node's `cost`. `issued`: keys already
    generated or running; they count as chosen for free and are not returned.

    A depth-first search over, for each depth, which of the keys alive there to issue (every
    completed node needs its whole path issued, so choices only ever extend the alive frontier one
    depth at a time), pruned by the bound "each remaining request completes at most the mass still
    alive, less its cost". With a cost, a key whose nodes at this depth hold less mass than its
    requests cost is not tried: it cannot pay for itself, and the requests below it that only it
    makes reachable hold no more mass than it does (exact but for nodes that several paths reach).
    With cost 0 the search is exact. With one key per depth, as the rounds planner produces, it is
    linear; past MAX_SEARCH_NODES nodes it returns the best set found so far. `max_value`: the largest
    node value in the DAG, when its builder knows it (else a walk over the DAG finds it).
    `walk`: fresh `SearchWalks` of `root` and `issued`, which the search fills.
    """
    best_score = float("-inf")
    best: list[Hashable] = []
    if max_value is None:
        max_value = _max_node_value(root)
    visited = 0
    issued_set = set(issued)
    # How this call sees each node it meets, found once per node (a key's hash is a Python call):
    # _PASS (free or pending, no key or an issued one), _ISSUED, _DEAD, _KEYED_PASS (free or
    # pending with a key not issued: no planner makes one) or its key, not issued. The search and
    # its propagation below are `_propagate`'s and the plain search's operations, in their order:
    # the same floats, the same sets (tests/test_selection.py compares them).
    seen: dict[PlanNode, object] = {}

    def look(node: PlanNode) -> object:
        key = node.key
        if node.free or node.pending:
            kind: object = _PASS if key is None or key in issued_set else _KEYED_PASS
        elif key is None:
            kind = _DEAD
        else:
            kind = _ISSUED if key in issued_set else key
        seen[node] = kind
        return kind

    def propagate(alive: dict[PlanNode, float], chosen: set) -> tuple[float, dict[PlanNode, float]]:
        gain = 0.0
        reached: dict[PlanNode, float] = {}
        for node, mass in alive.items():
            kind = seen.get(node)
            if kind is None:
                kind = look(node)
            if kind is _ISSUED:
                gain += mass * node.value
            elif kind is _PASS or kind is _KEYED_PASS:
                pass  # completes nothing now, passes its mass on
            elif kind is _DEAD or kind not in chosen:
                continue
            else:
                gain += mass * node.value
            for child, p in node.children:
                if p > 0.0:
                    if child in reached:
                        reached[child] += mass * p
                    else:
                        reached[child] = mass * p  # 0.0 + x is x
        return gain, reached

    best_path: tuple[tuple[dict[PlanNode, float], ...], list[dict[PlanNode, float]]] = ((), [])

    def search(
        alive: dict[PlanNode, float], chosen: list, chosen_set: set, score: float, left: int,
        above: tuple[dict[PlanNode, float], ...], trail: list[dict[PlanNode, float]],
    ) -> None:
        """`above`: the depths of the walk through `chosen_set` before this call's; `trail`: this
        call's, from `alive` on (each pass adds the next depth it walks without a new key)."""
        nonlocal best_score, best, visited, best_path
        while True:  # one depth per pass: the plain search's last call (no new key) is the next pass
            visited += 1
            if score > best_score + 1e-12:
                best_score, best = score, list(chosen)
                best_path = (above, trail)  # the trail grows as this call walks on with the same keys
            if left == 0 or not alive or visited > MAX_SEARCH_NODES:
                return
            if score + left * max(0.0, sum(alive.values()) * max_value - cost_per_request) <= best_score + 1e-12:
                return
            # one pass: each new key's mass here, and whether the walk can pass this depth without one
            mass_by_key: dict[Hashable, float] = {}
            cost_of: dict[Hashable, int] = {}
            passes_without_new_key = False
            for node, mass in alive.items():
                kind = seen.get(node)
                if kind is None:
                    kind = look(node)
                if kind is _ISSUED or kind is _PASS:
                    passes_without_new_key = True
                elif kind is _DEAD:
                    pass
                else:
                    key = node.key if kind is _KEYED_PASS else kind
                    if key in chosen_set:
                        passes_without_new_key = True
                    else:
                        mass_by_key[key] = mass_by_key.get(key, 0.0) + mass * node.value
                        cost_of[key] = node.cost
                        passes_without_new_key = passes_without_new_key or kind is _KEYED_PASS
            if mass_by_key:
                candidates = [k for k in mass_by_key if mass_by_key[k] >= cost_per_request * cost_of[k]]
                candidates = sorted(candidates, key=mass_by_key.__getitem__, reverse=True)[:MAX_KEYS_PER_DEPTH]
                for size in range(len(candidates), 0, -1):
                    for subset in combinations(candidates, size):
                        cost = sum(cost_of[k] for k in subset)
                        if cost > left:
                            continue
                        extended = chosen_set.union(subset)  # never changed in place
                        gain, reached = propagate(alive, extended)
                        search(
                            reached, chosen + list(subset), extended, score + gain - cost_per_request * cost, left - cost,
                            above + tuple(trail), [reached],
                        )
            if not passes_without_new_key:
                return
            gain, alive = propagate(alive, chosen_set)
            score = score + gain - cost_per_request * 0
            trail.append(alive)

    top: list[dict[PlanNode, float]] = [{root: 1.0}]
    if walk is not None:
        if walk.root is not root or walk.issued != issued_set or walk.chosen is not None:
            raise ValueError("the walks must be fresh SearchWalks of this root and issued set")
        top = walk.issued_depths
    search(top[0], [], issued_set, 0.0, budget, (), top)
    if walk is not None:
        walk.chosen = issued_set.union(best)
        walk.chosen_depths = [*best_path[0], *best_path[1]]
    # `search` calls itself through its closure: a cycle that, left, waits for the cyclic
    # collector with the call's dicts (Python's collections then cost ~20% of a streaming run)
    del search
    return best


# how select_max_expected's search sees a node (else: the node's key, not issued)
_PASS, _ISSUED, _DEAD, _KEYED_PASS = object(), object(), object(), object()
