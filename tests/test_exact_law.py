"""The sampler follows its exact law (docs/algorithm.md), checked by enumeration and chi-square."""

import math
from collections import Counter

import pytest

from presto_ray import SamplerConfig, sample
from presto_ray.engines.toy import ToyEngine
from presto_ray.kernels import EntropyCut, MultiTryKernel, PowerMHKernel, Transition

from exact_law import Enumerator, chi_square_pvalue

NUM_CHAINS = 3000
PROMPT = (1, 2)


class NoLengthCorrection(PowerMHKernel):
    """The reference code's flaw: no cut-probability correction when lengths differ."""

    def cut_correction(self, state, cut, candidate) -> float:
        return 0.0


class EntropyCutWithoutItsTerm(PowerMHKernel):
    """EntropyCut's cut law with the uniform cut's correction: the lambda ratio left out."""

    def cut_correction(self, state, cut, candidate) -> float:
        return math.log(len(state)) - math.log(len(candidate))


class NaiveMultiTry(MultiTryKernel):
    """Selects a try as MultiTryMH does, then accepts it with the single-try ratio w(y)/w(x)."""

    def transition(self, state, cut, proposals, keys):
        weights = [self.log_weight(float(p.logp0.sum()), float(p.logq.sum())) for p in proposals]
        chosen = self._select(weights, max(weights) + math.log(sum(math.exp(w - max(weights)) for w in weights)), keys.selection_uniform)
        candidate = state.replace_suffix(cut, proposals[chosen])
        log_ratio = weights[chosen] - self.log_weight(state.suffix_logp0(cut), state.suffix_logq(cut))
        log_ratio += self.cut_correction(state, cut, candidate)
        accepted = math.log(keys.accept_uniform) < log_ratio
        return Transition(candidate if accepted else state, log_ratio, accepted)


def _engine():
    return ToyEngine(vocab_size=3, eos_token_id=0, seed=7, logit_scale=1.0, eos_bias=0.3)


CASES = {
    "eos-1block": dict(block_size=3, num_blocks=1, mh_steps=2, fixed_length=False),
    "eos-2blocks": dict(block_size=2, num_blocks=2, mh_steps=2, fixed_length=False),
    "fixed-1block": dict(block_size=3, num_blocks=1, mh_steps=2, fixed_length=True),
    "fixed-2blocks": dict(block_size=2, num_blocks=2, mh_steps=2, fixed_length=True),
}


def _empirical(engine, case, traversal, kernel=None, num_chains=NUM_CHAINS, schedule="rounds", **sampler):
    counts = Counter()
    for seed in range(num_chains):
        config = SamplerConfig(alpha=2.0, traversal=traversal, prefetch_budget=6, seed=seed, schedule=schedule, **case, **sampler)
        counts[sample(engine, PROMPT, config, kernel=kernel).token_ids] += 1
    return counts


def _exact(engine, case, naive_mtm=False, **kwargs):
    sampler = {k: kwargs.pop(k) for k in ("sampler", "num_tries") if k in kwargs}
    enum = Enumerator(engine, PROMPT, alpha=2.0, tau=0.5, **case, **sampler)
    enum.naive_mtm = naive_mtm
    return enum.final_distribution(**kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("traversal, schedule", [("serial", "rounds"), ("predictive", "rounds"), ("predictive", "streaming")])
def test_sampler_matches_exact_law(name, traversal, schedule):
    engine = _engine()
    exact = _exact(engine, CASES[name])
    counts = _empirical(engine, CASES[name], traversal, schedule=schedule)
    p = chi_square_pvalue(exact, counts, NUM_CHAINS)
    assert p > 1e-3, f"{name}/{traversal}/{schedule}: chi-square p = {p:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["eos-1block", "eos-2blocks"])
def test_broken_kernel_fails_the_same_test(name):
    """Power: dropping the length correction must be detected by the same statistic."""
    engine = _engine()
    exact = _exact(engine, CASES[name])
    counts = _empirical(engine, CASES[name], "bfs", kernel=NoLengthCorrection(2.0))
    p = chi_square_pvalue(exact, counts, NUM_CHAINS)
    assert p < 1e-6, f"the broken kernel passed: p = {p:.2e}"


def test_enumeration_sums_to_one_and_differs_without_correction():
    engine = _engine()
    right = _exact(engine, CASES["eos-1block"])
    wrong = _exact(engine, CASES["eos-1block"], length_correction=False)
    assert abs(sum(right.values()) - 1) < 1e-12
    assert max(abs(right.get(x, 0) - wrong.get(x, 0)) for x in set(right) | set(wrong)) > 0.01


VARIANTS = {
    "entropy_cut": dict(sampler="entropy_cut"),
    "multi_try": dict(sampler="multi_try", num_tries=3),
}
MTM_CHAINS = 4000


# streaming on the cheapest case (MultiTryMH on eos-2blocks takes minutes per schedule; the
# identity tests show streaming draws the rounds' samples seed for seed on every case)
VARIANT_RUNS = [(name, "rounds") for name in ("eos-1block", "eos-2blocks", "fixed-1block")] + [("eos-1block", "streaming")]


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("name, schedule", VARIANT_RUNS)
def test_variants_match_their_exact_law(variant, name, schedule):
    engine = _engine()
    exact = _exact(engine, CASES[name], **VARIANTS[variant])
    counts = _empirical(engine, CASES[name], "predictive", num_chains=MTM_CHAINS, schedule=schedule, **VARIANTS[variant])
    p = chi_square_pvalue(exact, counts, MTM_CHAINS)
    assert p > 1e-3, f"{variant}/{name}: chi-square p = {p:.2e}"


@pytest.mark.slow
def test_entropy_cut_without_its_cut_law_term_fails():
    engine = _engine()
    case = CASES["eos-1block"]
    exact = _exact(engine, case, sampler="entropy_cut")
    counts = _empirical(engine, case, "bfs", kernel=EntropyCutWithoutItsTerm(2.0, EntropyCut(4.0)), sampler="entropy_cut")
    p = chi_square_pvalue(exact, counts, NUM_CHAINS)
    assert p < 1e-6, f"the broken EntropyCut passed: p = {p:.2e}"


@pytest.mark.slow
def test_multi_try_with_the_single_try_ratio_fails():
    engine = _engine()
    case = CASES["eos-1block"]
    exact = _exact(engine, case, sampler="multi_try", num_tries=3)
    assert _exact(engine, case, naive_mtm=True, sampler="multi_try", num_tries=3) != exact
    counts = _empirical(engine, case, "bfs", kernel=NaiveMultiTry(2.0, 3), num_chains=MTM_CHAINS, sampler="multi_try", num_tries=3)
    p = chi_square_pvalue(exact, counts, MTM_CHAINS)
    assert p < 1e-6, f"the naive MultiTryMH passed: p = {p:.2e}"


# --- exact early rejection (on by default in every test above; here where it fires often) -----
ER_CASE = dict(block_size=4, num_blocks=1, mh_steps=3, fixed_length=False)


def _er_engine():
    return ToyEngine(vocab_size=3, eos_token_id=0, seed=7, logit_scale=2.0, eos_bias=0.3)


class BoundAssumingFullLength(PowerMHKernel):
    """A careless bound: |y| taken as the horizon, as if no proposal could end early at EOS. With
    EOS a shorter y raises the ratio by log|x| - log|y|, so this bound is too low."""

    def rejection_bound(self, state, cut, accept_uniform, candidate_length=None):
        return super().rejection_bound(state, cut, accept_uniform, candidate_length or ER_CASE["block_size"])


def _er_empirical(schedule="rounds", traversal="predictive", kernel=None, tau=0.5):
    counts, stopped = Counter(), 0
    for seed in range(NUM_CHAINS):
        config = SamplerConfig(
            alpha=2.0, proposal_temperature=tau, traversal=traversal, prefetch_budget=6, seed=seed, schedule=schedule, **ER_CASE
        )
        result = sample(_er_engine(), PROMPT, config, kernel=kernel)
        counts[result.token_ids] += 1
        stopped += result.stats.early_rejected_steps
    return counts, stopped


@pytest.mark.slow
@pytest.mark.parametrize("traversal, schedule", [("serial", "rounds"), ("predictive", "rounds"), ("predictive", "streaming")])
def test_early_rejection_keeps_the_exact_law(traversal, schedule):
    exact = Enumerator(_er_engine(), PROMPT, alpha=2.0, tau=0.5, **ER_CASE).final_distribution()
    counts, stopped = _er_empirical(schedule, traversal)
    assert stopped > 0  # it fired (83 of 9000 steps measured with serial)
    p = chi_square_pvalue(exact, counts, NUM_CHAINS)
    assert p > 1e-3, f"{traversal}/{schedule}: chi-square p = {p:.2e}"


@pytest.mark.slow
def test_a_colder_proposal_keeps_the_exact_law_without_a_bound():
    exact = Enumerator(_er_engine(), PROMPT, alpha=2.0, tau=0.3, **ER_CASE).final_distribution()
    counts, stopped = _er_empirical(tau=0.3)
    assert stopped == 0  # tau < 1/alpha: no bound holds
    p = chi_square_pvalue(exact, counts, NUM_CHAINS)
    assert p > 1e-3, f"chi-square p = {p:.2e}"


@pytest.mark.slow
def test_a_careless_bound_fails_the_same_test():
    """Power: a bound that ignores EOS (too low for shorter proposals) must be detected."""
    exact = Enumerator(_er_engine(), PROMPT, alpha=2.0, tau=0.5, **ER_CASE).final_distribution()
    counts, stopped = _er_empirical(kernel=BoundAssumingFullLength(2.0, tau=0.5))
    p = chi_square_pvalue(exact, counts, NUM_CHAINS)
    assert stopped > 0 and p < 1e-6, f"the careless bound passed: p = {p:.2e}"
