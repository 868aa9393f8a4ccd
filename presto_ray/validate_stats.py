"""validate's statistics and tests: the per-sample statistics it compares, Welch TOST (is the
difference small?), Welch's difference test (is there one?), the verdict of one statistic, the
margins, and the normal-approximation power and sample sizes the run is sized by.

TOST: a statistic is equivalent when the 1 - 2 alpha confidence interval of the difference
(prefetch - serial, Welch's standard error, Welch-Satterthwaite degrees of freedom) lies inside
[-margin, margin], i.e. both one-sided tests reject at alpha. Margins are standardised by default
(0.5 pooled standard deviations: an effect size |d| < 0.5); an absolute one can be set per
statistic. The difference test (two-sided Welch, H0: equal means, each statistic at alpha / 5,
Bonferroni) says whether a difference is shown.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

STATISTICS: dict[str, str] = {
    "mean_logp0": "mean log p0 per token",
    "length": "tokens",
    "alpha_logp0": "alpha * log p0(x)",
    "acceptance_rate": "acceptance rate",
    "eos": "ends at EOS (the EOS rate)",
}
DEFAULT_MARGIN_SD = 0.5
DEFAULT_ALPHA_LEVEL = 0.05
POWER_TARGET = 0.9  # the default run is sized for this power against the fault, where it can be


@dataclass(frozen=True)
class TostResult:
    """Welch TOST of mean(b) - mean(a) against [-margin, margin]."""

    mean_a: float
    mean_b: float
    n_a: int
    n_b: int
    difference: float  # mean_b - mean_a
    ci_low: float  # the 1 - 2 alpha confidence interval of the difference
    ci_high: float
    margin: float
    df: float
    p_lower: float  # H0: difference <= -margin
    p_upper: float  # H0: difference >= margin
    alpha: float

    @property
    def p_value(self) -> float:
        return max(self.p_lower, self.p_upper)

    @property
    def equivalent(self) -> bool:
        return self.p_value < self.alpha


def tost(a: Sequence[float], b: Sequence[float], margin: float, alpha: float = DEFAULT_ALPHA_LEVEL) -> TostResult:
    """Two one-sided Welch t-tests: is |mean(b) - mean(a)| < margin, at level alpha?

    Equivalent exactly when the 1 - 2 alpha confidence interval of the difference (Welch's
    standard error and Welch-Satterthwaite degrees of freedom) lies inside [-margin, margin].
    Without spread in either sample (e.g. every length at the horizon) the difference is known
    exactly: equivalent when it is within the margin.
    """
    from scipy.stats import t as student_t  # scipy comes with scikit-learn, a core dependency

    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(x) < 2 or len(y) < 2:
        raise ValueError("TOST needs at least two samples on each side")
    if not (0.0 < alpha < 0.5):
        raise ValueError("alpha must be in (0, 0.5)")
    if margin < 0:
        raise ValueError("the margin must be non-negative")
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    diff = float(y.mean() - x.mean())
    se = math.sqrt(va + vb)
    if se == 0.0:
        p = 0.0 if abs(diff) <= margin else 1.0
        return TostResult(float(x.mean()), float(y.mean()), len(x), len(y), diff, diff, diff, margin, math.inf, p, p, alpha)
    df = (va + vb) ** 2 / ((va**2 / (len(x) - 1) if va else 0.0) + (vb**2 / (len(y) - 1) if vb else 0.0))
    p_lower = float(student_t.sf((diff + margin) / se, df))
    p_upper = float(student_t.cdf((diff - margin) / se, df))
    half = float(student_t.ppf(1.0 - alpha, df)) * se
    return TostResult(float(x.mean()), float(y.mean()), len(x), len(y), diff, diff - half, diff + half, margin, float(df), p_lower, p_upper, alpha)


def welch_difference(a: Sequence[float], b: Sequence[float]) -> float:
    """The two-sided p-value of Welch's t-test of equal means (no spread on either side: 0 when
    the means differ, 1 when they agree)."""
    from scipy.stats import ttest_ind

    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.var() == 0.0 and y.var() == 0.0:
        return 0.0 if x.mean() != y.mean() else 1.0
    with warnings.catch_warnings():  # one side without spread (every chain accepting): scipy warns, the test holds
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(ttest_ind(y, x, equal_var=False).pvalue)


def row_verdict(t: TostResult, difference_shown: bool = False) -> str:
    """`equivalent` (the interval inside the margin and no difference shown), `NOT equivalent`
    (the interval wholly beyond the margin, or the difference test rejects equal means: a
    difference is shown) or `not shown` (the interval straddles a bound: too few samples to tell)."""
    if difference_shown or t.ci_low > t.margin or t.ci_high < -t.margin:
        return "NOT equivalent"
    if t.equivalent:
        return "equivalent"
    return "not shown"


def _z(p: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(p))


def difference_power(shift: float, sd_a: float, sd_b: float, n: int, level: float) -> float:
    """The power of a two-sided test of equal means at `level` with n samples a side against a
    true difference `shift` (normal approximation)."""
    from scipy.stats import norm

    se = math.sqrt((sd_a**2 + sd_b**2) / n) if n else math.inf
    if se == 0.0:
        return 1.0 if shift != 0.0 else level
    z = _z(1.0 - level / 2.0)
    return float(norm.cdf(abs(shift) / se - z) + norm.cdf(-abs(shift) / se - z))


def samples_for_power(shift: float, sd: float, level: float, power: float = POWER_TARGET) -> int | None:
    """Samples per side for `power` against a shift of `shift` (None when the shift is 0)."""
    if shift == 0.0 or not math.isfinite(shift):
        return None
    if sd == 0.0:
        return 2
    return max(2, math.ceil(2.0 * ((_z(1.0 - level / 2.0) + _z(power)) * sd / abs(shift)) ** 2))


def samples_needed(margins: Margins) -> int | None:
    """Samples per side that give equal laws about a 95% chance per statistic of passing the
    standardised margin (None with absolute margins: their scale is the user's)."""
    if margins.absolute:
        return None
    return math.ceil(2 * (3.6 / margins.sd) ** 2)


def pooled_sd(a: Sequence[float], b: Sequence[float]) -> float:
    """The standard deviation of both samples together (the scale of standardised margins)."""
    return float(np.std(np.concatenate([np.asarray(a, float), np.asarray(b, float)]), ddof=1))


# --- margins -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Margins:
    """Per statistic: a standardised margin (in pooled standard deviations) unless an absolute one is set."""

    sd: float = DEFAULT_MARGIN_SD
    absolute: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.sd <= 0:
            raise ValueError("the standardised margin must be positive")
        unknown = set(self.absolute) - set(STATISTICS)
        if unknown:
            raise ValueError(f"unknown statistic(s) {sorted(unknown)}; known: {', '.join(STATISTICS)}")
        if any(v < 0 for v in self.absolute.values()):
            raise ValueError("absolute margins must be non-negative")

    @classmethod
    def parse(cls, specs: Sequence[str]) -> "Margins":
        """`0.3` sets the standardised margin of every statistic; `length=2` an absolute one."""
        sd, absolute = DEFAULT_MARGIN_SD, {}
        for spec in specs:
            name, sep, value = spec.partition("=")
            try:
                if sep:
                    absolute[name.strip()] = float(value)
                else:
                    sd = float(spec)
            except ValueError:
                raise ValueError(f"--margin: expected a number or NAME=NUMBER, got {spec!r}") from None
        return cls(sd, absolute)

    def margin(self, name: str, a: Sequence[float], b: Sequence[float]) -> tuple[float, str]:
        if name in self.absolute:
            return self.absolute[name], "absolute"
        return self.sd * pooled_sd(a, b), f"{self.sd:g} sd"


def compare_statistic(
    name: str, serial: Sequence[Mapping[str, float]], prefetch: Sequence[Mapping[str, float]], margins: Margins,
    alpha_level: float, level: float,
) -> dict:
    """One statistic's row: both means, TOST against its margin, the difference test at `level`, the verdict."""
    a = [x[name] for x in serial]
    b = [x[name] for x in prefetch]
    margin, kind = margins.margin(name, a, b)
    t = tost(a, b, margin, alpha_level)
    p_difference = welch_difference(a, b)
    shown = p_difference < level
    return {
        "statistic": name,
        "mean_serial": t.mean_a,
        "mean_prefetch": t.mean_b,
        "difference": t.difference,
        "ci_low": t.ci_low,
        "ci_high": t.ci_high,
        "margin": t.margin,
        "margin_kind": kind,
        "pooled_sd": pooled_sd(a, b),
        "p_lower": t.p_lower,
        "p_upper": t.p_upper,
        "p_value": t.p_value,
        "p_difference": p_difference,  # Welch, two-sided, H0: equal means
        "difference_level": level,
        "difference_shown": shown,
        "df": t.df if math.isfinite(t.df) else None,
        "n_serial": t.n_a,
        "n_prefetch": t.n_b,
        "equivalent": t.equivalent and not shown,
        "verdict": row_verdict(t, shown),
    }
