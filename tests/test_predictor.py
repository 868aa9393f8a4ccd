"""The edge predictor: the paper's prior, labels, and online refitting."""

import numpy as np
import pytest

from presto_ray.predictor import ACCEPT, PAPER_INTERCEPTS, PAPER_SLOPES, REJECT, UNCERTAIN, EdgePredictor


def test_cold_start_is_the_papers_fit():
    p = EdgePredictor().class_probabilities(0.5)
    z = PAPER_INTERCEPTS + 0.5 * PAPER_SLOPES
    np.testing.assert_allclose(p, np.exp(z) / np.exp(z).sum())
    predictor = EdgePredictor()
    # The paper's fit: early cuts are mostly certain rejections, late cuts more often accepted.
    assert predictor.accept_branch_probability(0.05) < predictor.accept_branch_probability(0.95)


def test_labels_use_eps():
    predictor = EdgePredictor(eps=0.01)
    assert predictor.label(0.995) == ACCEPT
    assert predictor.label(0.005) == REJECT
    assert predictor.label(0.5) == UNCERTAIN


def test_refit_learns_the_chains_own_edges():
    predictor = EdgePredictor(refit_every=50, prior_strength=10.0)
    before = predictor.accept_branch_probability(0.1)
    rng = np.random.default_rng(0)
    for _ in range(200):  # this chain accepts early cuts with certainty
        predictor.observe(float(rng.uniform(0, 0.3)), 1.0)
    assert predictor.num_fits == 4
    assert predictor.accept_branch_probability(0.1) > before + 0.3


def test_no_refit_when_disabled():
    predictor = EdgePredictor(refit=False, refit_every=1)
    predictor.observe(0.2, 1.0)
    assert predictor.num_fits == 0
    np.testing.assert_array_equal(predictor.intercepts, PAPER_INTERCEPTS)


@pytest.mark.parametrize("strength", [0.0, 64.0])
def test_refit_keeps_three_classes(strength):
    predictor = EdgePredictor(refit_every=5, prior_strength=strength)
    for _ in range(5):
        predictor.observe(0.9, 1.0)  # only one class observed
    assert predictor.num_fits == 1 and predictor.intercepts.shape == (3,)


@pytest.mark.parametrize("cut_fraction", [0.05, 0.5, 0.95])
def test_the_accept_uniform_sharpens_the_branch_probability(cut_fraction):
    """Given V the accept branch is P_acc + P_unc (1 - V): it falls as V grows, lies between
    P_acc and P_acc + P_unc, and averages over V to the h+ that does not know V."""
    predictor = EdgePredictor()
    p = predictor.class_probabilities(cut_fraction)
    grid = (np.arange(10_000) + 0.5) / 10_000
    given_v = np.array([predictor.accept_branch_probability(cut_fraction, v) for v in grid])
    assert np.all(np.diff(given_v) < 0)
    assert given_v[0] == pytest.approx(p[ACCEPT] + p[UNCERTAIN], abs=1e-3)
    assert given_v[-1] == pytest.approx(p[ACCEPT], abs=1e-3)
    assert given_v.mean() == pytest.approx(predictor.accept_branch_probability(cut_fraction), abs=1e-9)
