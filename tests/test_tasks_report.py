"""The unbiased pass@k, Wilson intervals, the report's figures."""

from __future__ import annotations

import itertools
from math import comb

import pytest

from presto_ray.tasks.base import Grade
from presto_ray.tasks.report import GradedSample, grade_report, pass_at_k, wilson_interval


@pytest.mark.parametrize("n, c", [(1, 0), (1, 1), (5, 2), (10, 3), (10, 10), (20, 1)])
def test_pass_at_k_is_the_unbiased_estimator(n, c):
    for k in range(1, n + 1):
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))
        # the same as the share of k-subsets of the samples holding a correct one
        samples = [True] * c + [False] * (n - c)
        subsets = list(itertools.combinations(samples, k)) if n <= 10 else None
        if subsets:
            assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)
    with pytest.raises(ValueError):
        pass_at_k(n, c, n + 1)


def test_wilson_interval_known_values():
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.27753), abs=1e-5)
    assert wilson_interval(5, 10) == pytest.approx((0.23659, 0.76341), abs=1e-5)


def test_report_with_unequal_samples_takes_k_up_to_the_fewest():
    right, wrong = Grade(True, "correct"), Grade(False, "wrong")
    samples = [GradedSample("a", 0, right), GradedSample("a", 1, wrong), GradedSample("a", 2, wrong),
               GradedSample("b", 0, wrong), GradedSample("b", 1, wrong)]  # fmt: skip
    report = grade_report(samples, ["a", "b", "c"])
    assert report["accuracy"] == pytest.approx(1 / 5)
    assert set(report["pass_at_k"]) == {"1", "2"}
    assert report["pass_at_k"]["1"] == pytest.approx((1 / 3 + 0) / 2)
    assert report["pass_at_k"]["2"] == pytest.approx((1 - comb(2, 2) / comb(3, 2)) / 2)
    assert report["problems"] == 2 and report["problems_without_completions"] == 1
    assert report["ci_low"] is None  # several samples per problem: no interval over rows
    assert report["statuses"] == {"wrong": 4, "correct": 1}
    assert [r["sample"] for r in report["rows"]] == [0, 1, 2, 0, 1]
    single = grade_report([GradedSample("a", 0, right), GradedSample("b", 0, wrong)], ["a", "b"])
    assert single["ci_low"] is not None and single["ci_low"] <= 0.5 <= single["ci_high"]
