"""Request selection: the predictive optimiser against brute force; breadth-first's contract."""

import itertools
import random

import pytest

from presto_ray.selection import PlanNode, expected_completed, select_breadth_first, select_max_expected


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
