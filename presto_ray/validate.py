"""`presto-ray validate`: does the prefetching schedule sample the serial chain's law on this model?

On deterministic engines prefetching replays the serial chain token for token (the identity
tests). On a GPU, kernels are not batch-invariant: a token can flip between a batched and an
unbatched call, so only the law can be compared. This module runs serial PowerMH and the config's
schedule on the same prompts with independent seeds and runs TOST (two one-sided Welch t-tests)
on per-sample statistics:

- `mean_logp0`: the sample's mean log p0 per token;
- `length`: its number of tokens;
- `alpha_logp0`: alpha * log p0(x), the log of the unnormalised target p0(x)**alpha;
- `acceptance_rate`: the chain's accepted / transitions.

Margins (the largest difference still called equivalent) are standardised by default: 0.5 times
the pooled standard deviation of the statistic (both runs together), i.e. an effect size of
|d| < 0.5; an absolute margin can be set per statistic. The verdict is `equivalent` when the
1 - 2 alpha_level confidence interval of the difference (prefetch - serial) lies inside
[-margin, margin], i.e. both one-sided tests reject at alpha_level.

`fault=True` runs the prefetching side with a kernel that drops the cut-probability (length)
correction log|x| - log|y|: a chain with a wrong law, to show that the check can fail.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from presto_ray.backend import Backend
from presto_ray.config import SamplerConfig
from presto_ray.kernels import EntropyCut, MultiTryKernel, PowerMHKernel, UniformCut
from presto_ray.keys import derive_seed
from presto_ray.results import SampleResult
from presto_ray.table import format_table

STATISTICS: dict[str, str] = {
    "mean_logp0": "mean log p0 per token",
    "length": "tokens",
    "alpha_logp0": "alpha * log p0(x)",
    "acceptance_rate": "acceptance rate",
}
DEFAULT_MARGIN_SD = 0.5
DEFAULT_ALPHA_LEVEL = 0.05
SIDES = ("serial", "prefetch")


# --- the test ----------------------------------------------------------------------------
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


def row_verdict(t: TostResult) -> str:
    """`equivalent` (the interval inside the margin), `NOT equivalent` (the interval wholly beyond
    it: a difference larger than the margin is shown) or `not shown` (the interval straddles a
    bound: too few samples to tell)."""
    if t.equivalent:
        return "equivalent"
    if t.ci_low > t.margin or t.ci_high < -t.margin:
        return "NOT equivalent"
    return "not shown"


def samples_needed(margins: "Margins") -> int | None:
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


# --- the fault ---------------------------------------------------------------------------
class _NoCutCorrection:
    """Drops log P(c | y) - log P(c | x): for the uniform cut, the length correction log|x| - log|y|."""

    def cut_correction(self, state: object, cut: object, candidate: object) -> float:
        return 0.0


class PowerMHWithoutLengthCorrection(_NoCutCorrection, PowerMHKernel):
    """The published reference code's EOS bug (docs/algorithm.md, section 7): a wrong law."""


class MultiTryWithoutLengthCorrection(_NoCutCorrection, MultiTryKernel):
    """The same fault in MultiTryMH."""


def faulty_kernel(config: SamplerConfig) -> PowerMHKernel:
    """The config's kernel without its cut (length) correction: only `validate --fault` builds it."""
    cut_law = EntropyCut(config.entropy_beta) if config.sampler == "entropy_cut" else UniformCut()
    if config.sampler == "multi_try":
        return MultiTryWithoutLengthCorrection(config.alpha, config.num_tries, cut_law)
    return PowerMHWithoutLengthCorrection(config.alpha, cut_law)


# --- the run -----------------------------------------------------------------------------
def sample_statistics(result: SampleResult, alpha: float) -> dict[str, float]:
    logp0 = np.asarray(result.logp0, dtype=float)
    length = len(result.token_ids)
    return {
        "mean_logp0": float(logp0.mean()) if length else 0.0,
        "length": float(length),
        "alpha_logp0": float(alpha * logp0.sum()),
        "acceptance_rate": result.stats.acceptance_rate,
    }


@dataclass
class ValidationReport:
    config: dict  # the prefetching side's sampler config
    prompts: list[str]
    chains_per_prompt: int
    alpha_level: float
    fault: bool
    rows: list[dict]  # one per statistic
    samples: dict[str, list[dict]]  # per side: one dict of statistics per sample
    wall_time_s: dict[str, float]
    notes: list[str] = field(default_factory=list)

    @property
    def equivalent(self) -> bool:
        return all(row["equivalent"] for row in self.rows)

    @property
    def verdict(self) -> str:
        """`equivalent`, `NOT equivalent` (some statistic's interval lies beyond its margin: a
        difference is shown) or `equivalence not shown` (too few samples to tell either)."""
        if self.equivalent:
            return "equivalent"
        return "NOT equivalent" if any(r["verdict"] == "NOT equivalent" for r in self.rows) else "equivalence not shown"

    def to_json(self) -> dict:
        return {"equivalent": self.equivalent, "verdict": self.verdict, **asdict(self)}

    def table(self) -> str:
        headers = ["statistic", "serial", "prefetch", "difference", f"{1 - 2 * self.alpha_level:.0%} CI", "margin", "p", "verdict"]
        body = [
            [
                r["statistic"],
                _num(r["mean_serial"]),
                _num(r["mean_prefetch"]),
                _num(r["difference"], "+"),
                f"[{_num(r['ci_low'], '+')}, {_num(r['ci_high'], '+')}]",
                f"±{_num(r['margin'])} ({r['margin_kind']})",
                f"{r['p_value']:.3g}",
                r["verdict"],
            ]
            for r in self.rows
        ]
        return format_table(headers, body)


def _num(x: float, sign: str = "") -> str:
    """4 significant digits, without exponents for the small differences a table shows."""
    return f"{x:{sign}.4g}" if x == 0 or abs(x) >= 1e-3 else f"{x:{sign}.5f}"


def run_validation(
    backend: Backend,
    prompts: Sequence[tuple[str, Sequence[int]]],
    config: SamplerConfig,
    *,
    chains_per_prompt: int,
    margins: Margins = Margins(),
    alpha_level: float = DEFAULT_ALPHA_LEVEL,
    fault: bool = False,
    progress: Callable[[str], None] | None = None,
) -> ValidationReport:
    """Serial PowerMH vs `config`'s schedule on `prompts` ((id, token ids) pairs), independent seeds.

    Chain c of prompt i on side s has seed derive_seed(config.seed, s, i, c): the two sides never
    share a seed, and a rerun draws the same samples.
    """
    import time

    if config.traversal == "serial":
        raise ValueError("the config's traversal is 'serial': nothing to compare; use bfs or predictive")
    if chains_per_prompt * len(prompts) < 2:
        raise ValueError("validate needs at least two samples per side (prompts x chains)")
    sides = {
        "serial": config.model_copy(update={"traversal": "serial", "schedule": "rounds", "prefetch_budget": 1}),
        "prefetch": config,
    }
    notes = []
    if fault and config.fixed_length:
        notes.append("fixed_length: every state has the horizon's length, so the fault changes nothing")
    samples: dict[str, list[dict]] = {}
    wall: dict[str, float] = {}
    for s, (side, side_config) in enumerate(sides.items()):
        work = [(pid, tokens, c) for i, (pid, tokens) in enumerate(prompts) for c in range(chains_per_prompt)]
        seeds = [
            derive_seed(config.seed, s, i, c) for i in range(len(prompts)) for c in range(chains_per_prompt)
        ]
        if progress:
            progress(f"{side}: {len(work)} chains")
        start = time.perf_counter()
        results = backend.sample(
            [tokens for _, tokens, _ in work],
            [side_config.model_copy(update={"seed": seed}) for seed in seeds],
            kernel_factory=faulty_kernel if (fault and side == "prefetch") else None,
        )
        wall[side] = time.perf_counter() - start
        samples[side] = [
            {"prompt_id": pid, "chain": c, "seed": seed, **sample_statistics(r, config.alpha)}
            for (pid, _, c), seed, r in zip(work, seeds, results)
        ]
    n = len(samples["serial"])
    half_width = 1.6449 * math.sqrt(2.0 / n)  # in pooled sd, large-sample quantile at alpha 0.05
    if not margins.absolute and half_width > 0.6 * margins.sd:
        notes.append(
            f"{n} samples per side: a 90% interval spans about ±{half_width:.2f} sd, so even equal laws pass a "
            f"{margins.sd:g} sd margin only while the observed difference stays below {max(0.0, margins.sd - half_width):.2f} sd; "
            f"about {samples_needed(margins)} samples per side give equal laws a 95% chance per statistic"
        )
    rows = []
    for name in STATISTICS:
        a = [x[name] for x in samples["serial"]]
        b = [x[name] for x in samples["prefetch"]]
        margin, kind = margins.margin(name, a, b)
        t = tost(a, b, margin, alpha_level)
        rows.append(
            {
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
                "df": t.df if math.isfinite(t.df) else None,
                "n_serial": t.n_a,
                "n_prefetch": t.n_b,
                "equivalent": t.equivalent,
                "verdict": row_verdict(t),
            }
        )
    return ValidationReport(
        config=config.model_dump(),
        prompts=[pid for pid, _ in prompts],
        chains_per_prompt=chains_per_prompt,
        alpha_level=alpha_level,
        fault=fault,
        rows=rows,
        samples=samples,
        wall_time_s=wall,
        notes=notes,
    )
