"""Request selection: the predictive optimiser against brute force; breadth-first's contract."""

import itertools
import random

import pytest

from presto_ray.selection import (
    SearchWalks,
    PlanNode,
    _propagate,
    reach_probabilities,
    expected_completed,
    fork_points_worth_waking,
    select_breadth_first,
    select_max_expected,
)


def random_tree(rng: random.Random, max_depth: int, keys_per_depth: int, costs: bool = False) -> PlanNode:
    """A random planning tree: shared keys within a depth, free, pending and dead nodes, random branches."""

    def make(depth: int) -> PlanNode:
        node = PlanNode(depth=depth)
        kind = rng.random()
        if depth > 0 and kind < 0.08:
            return node  # dead: deferred
        if depth > 0 and kind < 0.16:
            node.free, node.value = True, 0.0
        elif depth > 0 and kind < 0.24:
            node.pending = True  # deferred on a fork point: no request now, the walk will pass it
        else:
            node.key = (depth, rng.randrange(keys_per_depth))
            node.cost = 1 + (hash(node.key) % 2 if costs else 0)  # one cost per key, as in the planner
        if depth < max_depth:
            h = rng.random()
            node.children = [(make(depth + 1), h), (make(depth + 1), 1 - h)]
        return node

    return make(0)


def reference_value(node: PlanNode, keys: set) -> float:
    """Independent recursive evaluation of the expected completed events."""
    if node.free or node.pending:
        own = 0.0
    elif node.key is not None and node.key in keys:
        own = node.value
    else:
        return 0.0
    return own + sum(p * reference_value(child, keys) for child, p in node.children)


def all_keys(node: PlanNode) -> dict:
    """key -> its cost in requests."""
    keys = {node.key: node.cost} if node.key is not None else {}
    for child, _ in node.children:
        keys.update(all_keys(child))
    return keys


@pytest.mark.parametrize("trial", range(60))
def test_max_expected_equals_brute_force(trial):
    rng = random.Random(trial)
    root = random_tree(rng, max_depth=rng.randint(1, 4), keys_per_depth=rng.randint(1, 3), costs=trial % 2 == 1)
    budget = rng.randint(1, 6)
    cost = rng.choice([0.0, 0.0, 0.1, 0.4])
    key_costs = all_keys(root)
    keys = sorted(key_costs)

    def spend(subset):
        return sum(key_costs[k] for k in subset)

    best = max(
        reference_value(root, set(subset)) - cost * spend(subset)
        for size in range(0, len(keys) + 1)
        for subset in itertools.combinations(keys, size)
        if spend(subset) <= budget
    )
    chosen = select_max_expected(root, budget, cost)
    assert len(chosen) == len(set(chosen)) and spend(chosen) <= budget
    got = reference_value(root, set(chosen)) - cost * spend(chosen)
    assert got == pytest.approx(best, abs=1e-9)
    assert expected_completed(root, chosen) == pytest.approx(reference_value(root, set(chosen)), abs=1e-12)


@pytest.mark.parametrize("trial", range(30))
def test_breadth_first_fills_the_budget_level_by_level(trial):
    rng = random.Random(1000 + trial)
    root = random_tree(rng, max_depth=4, keys_per_depth=2, costs=trial % 2 == 1)
    budget = rng.randint(2, 8)
    chosen = select_breadth_first(root, budget)
    costs = all_keys(root)
    assert chosen[0] == root.key
    assert len(chosen) == len(set(chosen)) and sum(costs[k] for k in chosen) <= budget
    depths = [key[0] for key in chosen]
    assert depths == sorted(depths)
    # Every chosen key is needed by a node reachable through chosen keys only.
    assert expected_completed(root, chosen) > 0


def test_one_key_per_depth_takes_the_first_depths():
    # A chain of depths with a shared key each (the planner's usual shape): optimal = first N depths.
    nodes = [PlanNode(depth=d, key=(d, ())) for d in range(6)]
    for parent, child in zip(nodes, nodes[1:]):
        parent.children = [(child, 0.9)]
    assert select_max_expected(nodes[0], 3) == [(0, ()), (1, ()), (2, ())]
    # A request must pay its cost: the 4th depth is reached with 0.9**3 = 0.729 < 0.75.
    assert select_max_expected(nodes[0], 6, cost_per_request=0.75) == [(0, ()), (1, ()), (2, ())]


def plain_select_max_expected(root, budget, cost_per_request=0.0, issued=(), max_value=None):
    """select_max_expected's search as first written (recursive, `_propagate` at every depth):
    the reference its faster form must follow operation for operation."""
    from itertools import combinations

    from presto_ray.selection import MAX_KEYS_PER_DEPTH, MAX_SEARCH_NODES, _max_node_value, _propagate

    best_score, best, visited = float("-inf"), [], 0
    if max_value is None:
        max_value = _max_node_value(root)

    def search(alive, chosen, chosen_set, score, left):
        nonlocal best_score, best, visited
        visited += 1
        if score > best_score + 1e-12:
            best_score, best = score, list(chosen)
        if left == 0 or not alive or visited > MAX_SEARCH_NODES:
            return
        if score + left * max(0.0, sum(alive.values()) * max_value - cost_per_request) <= best_score + 1e-12:
            return
        mass_by_key, cost_of, passes = {}, {}, False
        for node, mass in alive.items():
            key = node.key
            if key is None or key in chosen_set:
                passes = passes or key is not None or node.free or node.pending
            else:
                mass_by_key[key] = mass_by_key.get(key, 0.0) + mass * node.value
                cost_of[key] = node.cost
                passes = passes or node.free or node.pending
        candidates = [k for k in mass_by_key if mass_by_key[k] >= cost_per_request * cost_of[k]]
        candidates = sorted(candidates, key=mass_by_key.__getitem__, reverse=True)[:MAX_KEYS_PER_DEPTH]
        for size in range(len(candidates), -1, -1):
            if size == 0 and not passes:
                break
            for subset in combinations(candidates, size):
                cost = sum(cost_of[k] for k in subset)
                if cost > left:
                    continue
                extended = chosen_set.union(subset) if subset else chosen_set
                gain, reached = _propagate(alive, extended)
                search(reached, chosen + list(subset), extended, score + gain - cost_per_request * cost, left - cost)

    search({root: 1.0}, [], set(issued), 0.0, budget)
    return best, best_score, visited


def random_dag(rng: random.Random, depth: int, width: int, keys_per_depth: int) -> PlanNode:
    """A planner-like DAG: levels of nodes sharing children, keys shared within a level, free,
    pending and dead nodes, values 0 or 1, costs 1 or 2 per key."""
    levels = [[PlanNode(depth=0, key=(0, 0))]]
    for d in range(1, depth + 1):
        level = []
        for _ in range(rng.randint(1, width)):
            node = PlanNode(depth=d)
            kind = rng.random()
            if kind < 0.1:
                pass  # dead
            elif kind < 0.2:
                node.free, node.value = True, 0.0
            elif kind < 0.3:
                node.pending = True
            else:
                key = rng.randrange(keys_per_depth)
                node.key, node.cost = (d, key), 1 + key % 2
            level.append(node)
        levels.append(level)
    for above, below in zip(levels, levels[1:]):
        for node in above:
            if node.key is None and not (node.free or node.pending):
                continue
            children = rng.sample(below, min(len(below), rng.choice([1, 2, 2, 3])))
            weights = [rng.random() for _ in children]
            node.children = [(child, w / sum(weights)) for child, w in zip(children, weights)]
    return levels[0][0]


@pytest.mark.parametrize("trial", range(120))
def test_the_search_makes_the_plain_searchs_choices(trial):
    """The same keys as the plain search on planner-like DAGs, issued keys among them, every
    cost, and searches that stop at MAX_SEARCH_NODES (the same floats decide both)."""
    rng = random.Random(1000 + trial)
    root = random_dag(rng, depth=rng.randint(1, 24), width=rng.randint(1, 12), keys_per_depth=rng.randint(1, 8))
    keys = sorted(all_keys(root))
    issued = set(rng.sample(keys, rng.randint(0, len(keys))))
    issued.add(root.key)
    budget = rng.randint(1, 16)
    cost = rng.choice([0.0, 0.05, 0.2, 0.5])
    want, _, _ = plain_select_max_expected(root, budget, cost, issued)
    assert select_max_expected(root, budget, cost, issued=issued) == want


@pytest.mark.parametrize("trial", range(40))
def test_a_search_cut_short_keeps_the_plain_searchs_best_so_far(trial, monkeypatch):
    import presto_ray.selection as selection

    monkeypatch.setattr(selection, "MAX_SEARCH_NODES", 2 + trial % 4)
    rng = random.Random(7000 + trial)
    cost = rng.choice([0.0, 0.1])
    root = random_dag(rng, depth=16, width=14, keys_per_depth=6)
    while plain_select_max_expected(root, 12, cost, {root.key})[2] <= selection.MAX_SEARCH_NODES:
        root = random_dag(rng, depth=16, width=14, keys_per_depth=6)  # one the cap cuts short
    want, _, visited = plain_select_max_expected(root, 12, cost, {root.key})
    assert visited > selection.MAX_SEARCH_NODES  # the cap ended it
    assert select_max_expected(root, 12, cost, issued={root.key}) == want


def test_a_search_leaves_no_cycle_for_the_collector():
    """Its objects are freed as it returns (a streaming run calls it at every event; left in
    cycles, they made Python's cyclic collections ~20% of the run's CPU time)."""
    import gc

    rng = random.Random(3)
    roots = [random_dag(rng, depth=12, width=8, keys_per_depth=4) for _ in range(20)]
    while gc.collect():  # earlier tests' garbage: a collection's finalizers can free more (matplotlib's figures)
        pass
    gc.disable()
    try:
        for root in roots:
            select_max_expected(root, 8, 0.1, issued={root.key})
        assert gc.collect() == 0
    finally:
        gc.enable()


# --- which fork points are worth an event -------------------------------------------------------
def _pending_reach_reference(root: PlanNode, issued: set) -> list[tuple[int, tuple, float]]:
    """(depth, fork point, probability the walk reaches it through issued requests) per pending
    node, summed per depth and fork point: every root-to-node path, evaluated independently."""
    reach: dict[tuple[int, tuple], float] = {}

    def visit(node: PlanNode, mass: float) -> None:
        if node.pending:
            at = (node.depth, node.waits_for)
            reach[at] = reach.get(at, 0.0) + mass
        elif node.free or (node.key is not None and node.key in issued):
            pass
        else:
            return  # dead, or a request not issued: the walk stops here
        for child, p in node.children:
            visit(child, mass * p)

    visit(root, 1.0)
    return [(depth, fork, mass) for (depth, fork), mass in reach.items()]


@pytest.mark.parametrize("trial", range(40))
def test_fork_points_worth_waking_are_those_reached_often_enough(trial):
    rng = random.Random(trial)
    root = random_tree(rng, max_depth=6, keys_per_depth=2)
    sources = [("a", ()), ("b", ())]

    def mark(node: PlanNode) -> None:  # every pending node waits for one of two requests
        if node.pending:
            node.waits_for = (rng.choice(sources), rng.randrange(1, 3))  # few: nodes share fork points
        for child, _ in node.children:
            mark(child)

    mark(root)
    issued = {key for key in all_keys(root) if rng.random() < 0.7}
    reach = _pending_reach_reference(root, issued)
    for min_reach in (0.0, 0.05, 0.2, 0.6, *(0.999 * mass for _, _, mass in reach)):  # each bar just below a sum
        expected: dict = {}
        for _, (source, needed), mass in reach:
            if mass >= min_reach - 1e-12:
                expected[source] = min(needed, expected.get(source, needed))
        worth = fork_points_worth_waking(root, issued, min_reach)
        # a reach within rounding of the bar may land on either side of it
        borderline = {source for _, (source, _), mass in reach if abs(mass - min_reach) < 1e-9}
        assert {k: v for k, v in worth.items() if k not in borderline} == {k: v for k, v in expected.items() if k not in borderline}


def _walk_reference(root: PlanNode, chosen: set) -> list[dict]:
    """The walk through `chosen` keys, depth by depth, as `_propagate` makes it."""
    depths, alive = [], {root: 1.0}
    while alive:
        depths.append(alive)
        alive = _propagate(alive, chosen)[1]
    return depths


def _random_dag_with_fork_points(rng: random.Random) -> PlanNode:
    root = random_dag(rng, depth=rng.randint(1, 20), width=rng.randint(1, 10), keys_per_depth=rng.randint(1, 6))
    sources = [("a", ()), ("b", ()), ("c", ())]
    seen, stack = set(), [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.pending:
            node.waits_for = (rng.choice(sources), rng.randrange(1, 4))
        stack.extend(child for child, _ in node.children)
    return root


@pytest.mark.parametrize("trial", range(80))
def test_the_walks_a_search_records_are_the_walks_made_anew(trial):
    """The depths a search walked through the issued requests alone, and through them and the
    keys it chose, are those walks' own (the same nodes, the same floats, in order), as far as the
    search went (to the end, or stopped by its bound, its node cap or its budget); the fork-point
    and reach passes that read them give what they give walking anew."""
    rng = random.Random(500 + trial)
    root = _random_dag_with_fork_points(rng)
    keys = sorted(all_keys(root))
    issued = set(rng.sample(keys, rng.randint(0, len(keys)))) | {root.key}
    walk = SearchWalks(root, issued)
    chosen = select_max_expected(root, rng.randint(1, 12), rng.choice([0.0, 0.05, 0.1, 0.3, 0.9]), issued=issued, walk=walk)
    assert walk.chosen == issued | set(chosen)
    for recorded, reference in ((walk.issued_depths, _walk_reference(root, issued)), (walk.chosen_depths, _walk_reference(root, walk.chosen))):
        assert 1 <= len(recorded) <= len(reference) + 1  # the last may be the empty dict that ends it
        for got, want in zip(recorded, reference + [{}]):
            assert list(got.items()) == list(want.items())
    for min_reach in (0.0, 0.01, 0.1, 0.3):
        assert fork_points_worth_waking(root, issued, min_reach, walk) == fork_points_worth_waking(root, issued, min_reach)
    assert reach_probabilities(root, walk.chosen, walk) == reach_probabilities(root, walk.chosen)


def test_the_search_records_its_chosen_walk_past_where_it_chose():
    """Somewhere in these trials the search chooses keys and its path to them holds more depths
    than the issued walk: the chosen walk is not the issued one."""
    differ = 0
    for trial in range(80):
        rng = random.Random(500 + trial)
        root = _random_dag_with_fork_points(rng)
        keys = sorted(all_keys(root))
        issued = set(rng.sample(keys, rng.randint(0, len(keys)))) | {root.key}
        walk = SearchWalks(root, issued)
        select_max_expected(root, rng.randint(1, 12), rng.choice([0.0, 0.05, 0.1, 0.3, 0.9]), issued=issued, walk=walk)
        differ += walk.chosen != walk.issued and len(walk.chosen_depths) > 2
    assert differ >= 10


def test_walks_of_another_issued_set_are_not_read():
    rng = random.Random(4)
    root = random_dag(rng, depth=6, width=4, keys_per_depth=2)
    walk = SearchWalks(root, {root.key})
    with pytest.raises(ValueError):
        select_max_expected(root, 4, 0.1, issued=set(), walk=walk)
    select_max_expected(root, 4, 0.1, issued={root.key}, walk=walk)
    with pytest.raises(ValueError):  # filled already
        select_max_expected(root, 4, 0.1, issued={root.key}, walk=walk)
    # a reach of other keys walks anew
    other = set(all_keys(root))
    assert reach_probabilities(root, other, walk) == reach_probabilities(root, other)
