"""The sampler follows the exact law of ALGORITHM.md, checked by enumeration and chi-square."""

from collections import Counter

import pytest

from presto_ray import SamplerConfig, sample
from presto_ray.engines.toy import ToyEngine
from presto_ray.kernels import PowerMHKernel

from exact_law import Enumerator, chi_square_pvalue

NUM_CHAINS = 3000
PROMPT = (1, 2)


class NoLengthCorrection(PowerMHKernel):
    """The reference code's flaw: no cut-probability correction when lengths differ."""

    @staticmethod
    def cut_correction(len_x: int, len_y: int) -> float:
        return 0.0


def _engine():
    return ToyEngine(vocab_size=3, eos_token_id=0, seed=7, logit_scale=1.0, eos_bias=0.3)


CASES = {
    "eos-1block": dict(block_size=3, num_blocks=1, mh_steps=2, fixed_length=False),
    "eos-2blocks": dict(block_size=2, num_blocks=2, mh_steps=2, fixed_length=False),
    "fixed-1block": dict(block_size=3, num_blocks=1, mh_steps=2, fixed_length=True),
    "fixed-2blocks": dict(block_size=2, num_blocks=2, mh_steps=2, fixed_length=True),
}


def _empirical(engine, case, traversal, kernel=None):
    counts = Counter()
    for seed in range(NUM_CHAINS):
        config = SamplerConfig(alpha=2.0, traversal=traversal, prefetch_budget=4, seed=seed, **case)
        counts[sample(engine, PROMPT, config, kernel=kernel).token_ids] += 1
    return counts


def _exact(engine, case, **kwargs):
    enum = Enumerator(engine, PROMPT, alpha=2.0, tau=0.5, **case)
    return enum.final_distribution(**kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("traversal", ["serial", "predictive"])
def test_sampler_matches_exact_law(name, traversal):
    engine = _engine()
    exact = _exact(engine, CASES[name])
    counts = _empirical(engine, CASES[name], traversal)
    p = chi_square_pvalue(exact, counts, NUM_CHAINS)
    assert p > 1e-3, f"{name}/{traversal}: chi-square p = {p:.2e}"


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
