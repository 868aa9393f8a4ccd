"""The incremental plan (PlanCache) is the plan built from nothing: at every tree a chain asks
for, in every schedule, sampler and early-rejection setting, node for node (keys, flags, values,
costs, branch probabilities, the DAG's shape) and in the tree's sets and fork points (in order)."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from presto_ray import SamplerConfig
from presto_ray.chain import Chain
from presto_ray.driver import run_chain
from presto_ray.engines.toy import ToyEngine
from presto_ray.plan_cache import PlanCache, build_plan_tree
from presto_ray.plan_tree import MAX_PLAN_DEPTH, PlanTree
from presto_ray.planner import Planner
from identity_helpers import CONFIG_FIELDS, engines


def assert_same_tree(tree: PlanTree, reference: PlanTree) -> None:
    assert tree.keys == reference.keys
    assert list(tree.fork_points.items()) == list(reference.fork_points.items())
    assert tree.forks == reference.forks
    assert tree.root_state_keys == reference.root_state_keys
    assert tree.max_value == reference.max_value
    pairs = {id(reference.root): tree.root}
    level = [(tree.root, reference.root)]
    while level:
        following = []
        for node, other in level:
            assert (node.depth, node.key, node.free, node.pending, node.value, node.cost) == (
                other.depth, other.key, other.free, other.pending, other.value, other.cost
            )
            assert [p for _, p in node.children] == [p for _, p in other.children]
            for (child, _), (other_child, _) in zip(node.children, other.children):
                paired = pairs.setdefault(id(other_child), child)
                assert paired is child, "the DAG merges other nodes"
                following.append((child, other_child))
        level = list({id(pair[1]): pair for pair in following}.values())


@pytest.fixture
def checked_trees(monkeypatch):
    """Every Planner.tree checked against a tree built from nothing; returns the count."""
    incremental = Planner.tree
    count = [0]

    def checked(self, proposal=None, stopped_early=None, changed=None):
        tree = incremental(self, proposal, stopped_early, changed)
        chain, config = self.chain, self.chain.config
        rules = self._rules
        reference = build_plan_tree(
            chain.state.tokens, chain.event_index, chain.schedule,
            fixed_length=rules.fixed_length, stop_at_eos=rules.stop_at_eos, eos_token_id=rules.eos_token_id,
            cut_for=rules.cut_for, accept_branch_probability=rules.accept_branch_probability,
            max_keyed_depth=1 if config.traversal == "serial" else config.prefetch_budget,
            requests_per_step=rules.requests_per_step,
            proposal=proposal if chain.kernel.num_tries == 1 else None, stopped_early=stopped_early,
            min_reach=self._min_reach,
        )
        assert_same_tree(tree, reference)
        count[0] += 1
        return tree

    monkeypatch.setattr(Planner, "tree", checked)
    return count


configs = st.fixed_dictionaries(
    {
        **CONFIG_FIELDS,
        "sampler": st.sampled_from(["power_mh", "power_mh", "entropy_cut", "multi_try"]),
        "traversal": st.sampled_from(["bfs", "predictive"]),
        "schedule": st.sampled_from(["streaming", "streaming", "rounds"]),
    }
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(configs, engines, st.lists(st.integers(1, 11), max_size=4))
def test_every_incremental_tree_is_the_tree_from_nothing(checked_trees, config_kwargs, engine_kwargs, prompt):
    engine = ToyEngine(**engine_kwargs)
    prompt = [t % engine_kwargs["vocab_size"] for t in prompt]
    run_chain(engine, Chain(prompt, SamplerConfig(**config_kwargs), engine.eos_token_id))


@pytest.mark.parametrize("fixed_length", [True, False])
@pytest.mark.parametrize("early_rejection", [True, False])
@pytest.mark.parametrize("min_reach", [0.0, 0.01])
def test_a_long_streaming_chain_plans_incrementally_and_exactly(checked_trees, fixed_length, early_rejection, min_reach):
    """The toy job's shape (peaked model, 48-token blocks, budget 16): forks, fork points, stopped
    proposals and refits all happen, and every tree matches, whole or pruned."""
    engine = ToyEngine(vocab_size=64, eos_token_id=0, seed=1, logit_scale=4.0, eos_bias=-3.0)
    config = SamplerConfig(block_size=24, num_blocks=2, mh_steps=12, prefetch_budget=16, seed=5,
                           fixed_length=fixed_length, early_rejection=early_rejection, refit_every=8, plan_min_reach=min_reach)
    chain = Chain([5, 6, 7], config, engine.eos_token_id)
    run_chain(engine, chain)
    assert checked_trees[0] > 50
    assert chain.stats.forked_requests > 0


def test_a_cache_that_outgrows_its_trees_starts_afresh(checked_trees, monkeypatch):
    """Superseded knowledge leaves nodes no tree reaches: past the limit the cache starts over,
    and its trees stay the trees from nothing."""
    import presto_ray.plan_cache as plan_cache

    engine = ToyEngine(vocab_size=64, eos_token_id=0, seed=1, logit_scale=4.0, eos_bias=-3.0)
    config = SamplerConfig(block_size=24, num_blocks=1, mh_steps=10, prefetch_budget=12, seed=2, refit_predictor=False)
    reference = Chain([5, 6, 7], config, engine.eos_token_id)
    run_chain(engine, reference)

    monkeypatch.setattr(plan_cache, "MIN_STORED_NODES", 0)
    monkeypatch.setattr(plan_cache, "MAX_STORED_PER_TREE_NODE", 1)
    afresh = []
    real_sync = PlanCache._sync

    def counting_sync(self, event_index, version):
        before = self._nodes
        started_afresh = real_sync(self, event_index, version)
        afresh.append(self._nodes is not before)
        assert started_afresh == afresh[-1]
        return started_afresh

    monkeypatch.setattr(PlanCache, "_sync", counting_sync)
    chain = Chain([5, 6, 7], config, engine.eos_token_id)
    run_chain(engine, chain)
    assert sum(afresh) > len(afresh) // 3  # at these limits every other tree or so starts afresh
    assert chain.state.tokens == reference.state.tokens and chain.stats == reference.stats


def test_knowledge_that_shrinks_or_comes_back_gives_the_trees_from_nothing(checked_trees):
    """Nodes below a running proposal name it instead of copying its tokens: a proposal that
    grows keeps them, one that is dropped, restarted with fewer tokens or finished must not leave
    a tree reading tokens it no longer has (each tree is checked against the tree from nothing)."""
    engine = ToyEngine(vocab_size=64, eos_token_id=0, seed=1, logit_scale=4.0, eos_bias=-3.0)
    config = SamplerConfig(block_size=24, num_blocks=2, mh_steps=12, prefetch_budget=16, seed=5,
                           fixed_length=True, schedule="streaming", refit_predictor=False)
    planner = Planner(Chain([5, 6, 7], config, engine.eos_token_id))
    root_key = planner.tree({}, set()).root.key
    tokens = tuple(range(1, 25))
    forks = 0
    for knowledge in [
        {root_key: (tokens[:5], False)},
        {root_key: (tokens[:12], False)},
        {},
        {root_key: (tokens[:3], False)},
        {root_key: (tokens[:20], False)},
        {root_key: (tokens[:20], False)},
        {root_key: (tokens[:8], False)},
        {root_key: (tokens, True)},
    ]:
        tree = planner.tree(knowledge, set())
        forks += len(tree.fork_points)
        below = sorted((key for key in tree.keys if key != root_key), key=lambda key: (key[0], len(key[1])))
        if below:  # a request below the running one runs too, then goes
            planner.tree({**knowledge, below[0]: (tokens[:4], False)}, set())
    assert forks > 0 and checked_trees[0] >= 12


def test_a_finished_proposals_states_keep_their_nodes_and_a_block_end_is_planned_again(checked_trees):
    """A proposal that ends makes the states below its accept edge exact: their nodes move to the
    exact facts instead of being built again (PlanCache._finish_source). A step whose cut falls
    before the proposal's tokens keeps its expansion, except at a block's end: there a state that
    now ends with EOS has no reject branch (the chain stops), so that node is expanded again.
    The case: EOS-aware, block 8, two steps a block; the first step's proposal ends with EOS at
    the length its state was guessed to have, and the block's last step cuts before it."""
    engine = ToyEngine(vocab_size=16, eos_token_id=0, seed=1)
    block = tuple(range(1, 9))  # the first block, no EOS
    for seed in range(40):
        config = SamplerConfig(block_size=8, num_blocks=2, mh_steps=2, prefetch_budget=8, seed=seed, fixed_length=False,
                               stop_at_eos=True, schedule="streaming", refit_predictor=False, plan_min_reach=0.0)
        planner = Planner(Chain([5, 6, 7], config, engine.eos_token_id))
        extension = planner.tree({}, set()).root.key
        knowledge = {extension: (block, True)}
        first_step = planner.tree(knowledge, set()).root.children[0][0]  # the extension's state
        below = first_step.children[0][0] if first_step.key is not None else None  # the first step's accept child: the block's end
        if below is None or below.key is None or len(below.key[1]) > len(first_step.key[1]):
            continue  # the block's last step cuts inside the first step's proposal here
        cut = len(first_step.key[1])
        ending = tuple(range(9, 9 + 8 - cut - 1)) + (0,)  # ends with EOS where the state was guessed to end
        before = checked_trees[0]
        tree = planner.tree({**knowledge, first_step.key: (ending, True)}, set())
        assert checked_trees[0] == before + 1
        moved = tree.root.children[0][0].children[0][0]
        assert moved is below  # the same node, now the exact state's
        assert [p for _, p in moved.children] == [1.0] or len(moved.children) == 1  # no reject branch after EOS
        return
    raise AssertionError("no seed gave a block's last step that cuts before the first step's proposal")


@pytest.mark.parametrize("seed, vocab_size, logit_scale, early_rejection", [(1, 64, 4.0, True), (5, 8, 6.0, False), (7, 16, 2.0, False)])
def test_finished_proposals_whose_states_the_plan_holds_already(checked_trees, seed, vocab_size, logit_scale, early_rejection):
    """Chains where a proposal ends in a state the plan holds a node for already (a peaked model
    proposes what a state has): the DAG merges into that node, and the node above on the moved
    reject chain is expanded again to find it; every tree is the tree from nothing."""
    engine = ToyEngine(vocab_size=vocab_size, eos_token_id=0, seed=seed % 3, logit_scale=logit_scale, eos_bias=-3.0)
    config = SamplerConfig(block_size=24, num_blocks=2, mh_steps=12, prefetch_budget=16, seed=seed, fixed_length=False,
                           early_rejection=early_rejection, refit_every=8, plan_min_reach=0.0)
    run_chain(engine, Chain([5, 6, 7][: 1 + seed % 3], config, engine.eos_token_id))
    assert checked_trees[0] > 50


def _reach(root):
    """The probability the walk reaches each node of a tree (floats): a node passes its mass on
    through its branches, a dead one passes nothing."""
    mass = {root: 1.0}
    level = [root]
    while level:
        following = {}
        for node in level:
            for child, p in node.children:
                mass[child] = mass.get(child, 0.0) + mass[node] * p
                following[child] = None
        level = list(following)
    return mass


@pytest.mark.parametrize("min_reach", [0.01, 0.05])
def test_a_pruned_plan_leaves_exactly_the_events_reached_below_min_reach(monkeypatch, min_reach):
    """At every tree of a streaming chain, built from nothing with and without `min_reach` (no
    keyed-depth limit, so pruning is the only difference): a node the pruned tree expands is
    reached with at least min_reach in it, and is the whole tree's node; one it leaves dead that
    the whole tree expands is reached with less."""
    engine = ToyEngine(vocab_size=64, eos_token_id=0, seed=1, logit_scale=4.0, eos_bias=-3.0)
    config = SamplerConfig(block_size=24, num_blocks=2, mh_steps=12, prefetch_budget=16, seed=5, plan_min_reach=min_reach)
    counts = {"trees": 0, "pruned": 0, "expanded": 0}
    incremental = Planner.tree

    def checking(self, proposal=None, stopped_early=None, changed=None):
        tree = incremental(self, proposal, stopped_early, changed)
        chain, rules = self.chain, self._rules
        common = dict(
            fixed_length=rules.fixed_length, stop_at_eos=rules.stop_at_eos, eos_token_id=rules.eos_token_id,
            cut_for=rules.cut_for, accept_branch_probability=rules.accept_branch_probability,
            max_keyed_depth=MAX_PLAN_DEPTH, proposal=proposal, stopped_early=stopped_early,
        )
        pruned = build_plan_tree(chain.state.tokens, chain.event_index, chain.schedule, min_reach=min_reach, **common)
        whole = build_plan_tree(chain.state.tokens, chain.event_index, chain.schedule, **common)
        whole_nodes = {(node.event.index, node.facts): node for node in _reach(whole.root)}
        for node, reach in _reach(pruned.root).items():
            other = whole_nodes[node.event.index, node.facts]
            if not node.dead:
                assert reach >= min_reach - 1e-9
                assert (node.key, node.free, node.pending) == (other.key, other.free, other.pending)
                counts["expanded"] += 1
            elif not other.dead:
                assert reach < min_reach + 1e-9
                counts["pruned"] += 1
        counts["trees"] += 1
        return tree

    monkeypatch.setattr(Planner, "tree", checking)
    run_chain(engine, Chain([5, 6, 7], config, engine.eos_token_id))
    assert counts["trees"] > 50 and counts["pruned"] > 0 and counts["expanded"] > counts["trees"], counts
