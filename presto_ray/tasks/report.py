"""Figures of a graded run: accuracy, the unbiased pass@k, Wilson intervals, the report's JSON."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from presto_ray.tasks.base import Grade


def wilson_interval(successes: float, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% by default); `successes` may be
    fractional (eval: a mean over several answers per problem, times the problems)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # the interval contains p; clamping also keeps rounding from putting 0 successes above 0
    return min(p, max(0.0, centre - half)), max(p, min(1.0, centre + half))


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from n samples of which c are correct (Chen et al. 2021):
    1 - C(n - c, k) / C(n, k), computed as a product (no huge binomials)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


@dataclass(frozen=True)
class GradedSample:
    id: str
    sample: int  # its index among its problem's samples, in file order
    grade: Grade


def grade_report(samples: Sequence[GradedSample], problem_ids: Sequence[str]) -> dict[str, Any]:
    """The report of graded samples over the problems `problem_ids` (dataset order):

    `accuracy` (mean over samples), `pass_at_k` (the unbiased estimator averaged over the problems
    that have samples, for k = 1 .. the fewest samples any of them has), `rows`, `per_problem`,
    counts of each status, and a 95% Wilson interval of the accuracy when every problem has one
    sample (with several, samples of one problem are not independent and it would be too narrow)."""
    by_problem: dict[str, list[bool]] = {}
    for s in samples:
        by_problem.setdefault(s.id, []).append(s.grade.correct)
    graded = [pid for pid in problem_ids if pid in by_problem]
    counts = [(len(by_problem[pid]), sum(by_problem[pid])) for pid in graded]
    fewest = min((n for n, _ in counts), default=0)
    most = max((n for n, _ in counts), default=0)
    correct = sum(s.grade.correct for s in samples)
    accuracy = correct / len(samples) if samples else 0.0
    ci = wilson_interval(correct, len(samples)) if samples and most == 1 else (None, None)
    return {
        "accuracy": accuracy,
        "correct": correct,
        "samples": len(samples),
        "problems": len(graded),
        "problems_without_completions": len(problem_ids) - len(graded),
        "samples_per_problem": {"min": fewest, "max": most},
        "ci_low": ci[0],
        "ci_high": ci[1],
        "pass_at_k": {str(k): float(np.mean([pass_at_k(n, c, k) for n, c in counts])) for k in range(1, fewest + 1)},
        "statuses": dict(Counter(s.grade.status for s in samples).most_common()),
        "per_problem": [{"id": pid, "samples": n, "correct": c} for pid, (n, c) in zip(graded, counts)],
        "rows": [
            {
                "id": s.id, "sample": s.sample, "correct": s.grade.correct, "status": s.grade.status,
                "extracted": s.grade.extracted, "detail": s.grade.detail,
            }
            for s in samples
        ],  # fmt: skip
    }


def shown_ks(pass_at: dict[str, float]) -> list[int]:
    """The k worth printing: 1, 5, 10, 100 ... and the largest."""
    ks = sorted(int(k) for k in pass_at)
    if not ks:
        return []
    return sorted({k for k in ks if k in (1, 2, 5, 10, 20, 50, 100)} | {ks[-1]})
