"""`presto-ray validate`: does the prefetching schedule sample the serial chain's law on this model?

On deterministic engines prefetching replays the serial chain token for token (the identity
tests). On a GPU, kernels are not batch-invariant: a token can flip between a batched and an
unbatched call, so only the law can be compared. This module runs serial PowerMH and the config's
schedule on the same prompts with independent seeds and runs TOST (two one-sided Welch t-tests)
on per-sample statistics:

- `mean_logp0`: the sample's mean log p0 per token;
- `length`: its number of tokens;
- `alpha_logp0`: alpha * log p0(x), the log of the unnormalised target p0(x)**alpha;
- `acceptance_rate`: the chain's accepted / transitions;
- `eos`: 1 when the sample ends at EOS, else 0 (the EOS rate).

Margins (the largest difference still called equivalent) are standardised by default: 0.5 times
the pooled standard deviation of the statistic (both runs together), i.e. an effect size of
|d| < 0.5; an absolute margin can be set per statistic. A statistic is `equivalent` when the
1 - 2 alpha_level confidence interval of the difference (prefetch - serial) lies inside
[-margin, margin], i.e. both one-sided tests reject at alpha_level, and the difference test
(two-sided Welch, H0: equal means, each statistic at alpha_level / 5, Bonferroni) shows no
difference: TOST says whether a difference is small, the difference test whether there is one.

`fault=True` runs the prefetching side with a kernel that drops the cut-probability (length)
correction log|x| - log|y|: a chain with a wrong law, to show that the check can fail.

Power against that fault (`FaultPower`) is computed from the serial side's own MH decisions, at no
extra sampling: the serial chains run with a kernel that records each step's log ratio and its
cut correction, so the faulty kernel's acceptance probability of the same step is known. The
faulty chain's law relative to the serial one's is then a product of per-step weights (A'/A for
an accepted step, (1 - A')/(1 - A) for a rejected one), which gives each statistic's expected shift
under the fault (importance weights: no mixing assumption), the power of each difference test
against it at the run's size, the samples per side that give 90% power, and a bound no test can
beat: the coupled correct and faulty chains differ with probability at most the expected number of
flipped decisions per chain d, so any test on n samples per side has power at most alpha + n d.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from presto_ray.backend import Backend
from presto_ray.config import SamplerConfig
from presto_ray.early_rejection import RejectionBound
from presto_ray.engines.base import Completion
from presto_ray.kernels import EntropyCut, MultiTryKernel, PowerMHKernel, Transition, UniformCut, build_kernel
from presto_ray.keys import StepKeys, derive_seed
from presto_ray.results import SampleResult
from presto_ray.state import ChainState
from presto_ray.table import format_table

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
MAX_GROWTHS = 4  # times the serial side may grow towards it (each growth refines the prediction)
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
    """The published reference code's EOS bug (docs/algorithm.md, section 7): a wrong law.

    With the uniform cut it keeps exact early rejection (its law is unchanged by it, its cost is
    the correct kernel's): its ratio is the clamped weight difference alone, which the kernel's
    bound gives when the cut terms cancel, i.e. with the candidate's length taken as the state's."""

    def _ratio_is_this_class(self) -> bool:
        return isinstance(self.cut_law, UniformCut)

    def rejection_bound(
        self, state: ChainState, cut: int, accept_uniform: float, candidate_length: int | None = None
    ) -> RejectionBound | None:
        if not isinstance(self.cut_law, UniformCut):
            return None
        return super().rejection_bound(state, cut, accept_uniform, candidate_length=len(state))


class MultiTryWithoutLengthCorrection(_NoCutCorrection, MultiTryKernel):
    """The same fault in MultiTryMH."""


def faulty_kernel(config: SamplerConfig) -> PowerMHKernel:
    """The config's kernel without its cut (length) correction: only `validate --fault` builds it."""
    cut_law = EntropyCut(config.entropy_beta) if config.sampler == "entropy_cut" else UniformCut()
    if config.sampler == "multi_try":
        return MultiTryWithoutLengthCorrection(config.alpha, config.num_tries, cut_law, config.tau)
    return PowerMHWithoutLengthCorrection(config.alpha, cut_law, config.tau)


# --- power against the fault -----------------------------------------------------------------
class _Recorder:
    """A kernel that is the config's own and records, per MH step, its log ratio, the cut
    correction in it and the decision (the faulty kernel's ratio is the log ratio less the
    correction). Its transitions are the kernel's (it calls them); only the records are added."""

    steps: list[tuple[float, float, bool]]
    _correction: float

    def cut_correction(self, state: ChainState, cut: int, candidate: ChainState) -> float:
        self._correction = super().cut_correction(state, cut, candidate)  # type: ignore[misc]
        return self._correction

    def transition(self, state: ChainState, cut: int, proposals: Sequence[Completion], keys: StepKeys) -> Transition:
        self._correction = 0.0
        t: Transition = super().transition(state, cut, proposals, keys)  # type: ignore[misc]
        self.steps.append((t.log_ratio, self._correction, t.accepted))
        return t


class DecisionRecorder:
    """The serial side's kernel factory: the config's kernel, recording each chain's steps by its seed."""

    def __init__(self) -> None:
        self.by_seed: dict[int, list[tuple[float, float, bool]]] = {}

    def __call__(self, config: SamplerConfig) -> PowerMHKernel:
        kernel = _recording(build_kernel(config))
        kernel.steps = self.by_seed.setdefault(config.seed, [])  # type: ignore[attr-defined]
        return kernel


_RECORDING_TYPES: dict[type, type] = {}


def _recording(base: PowerMHKernel) -> PowerMHKernel:
    """`base` as a recording kernel of its own class (same fields, same transitions)."""
    cls = type(base)
    if cls not in _RECORDING_TYPES:
        _RECORDING_TYPES[cls] = type(f"Recording{cls.__name__}", (_Recorder, cls), {})
    kernel: Any = object.__new__(_RECORDING_TYPES[cls])
    kernel.__dict__.update(base.__dict__)
    return kernel


def _accept_probability(log_ratio: float) -> float:
    if math.isnan(log_ratio):
        return 0.0  # a nan ratio rejects (log V < nan is false)
    return 1.0 if log_ratio >= 0.0 else math.exp(log_ratio)


def fault_weights(steps: Sequence[tuple[float, float, bool]]) -> tuple[float, float]:
    """For one chain's recorded steps: the likelihood ratio of its path under the faulty kernel
    (same cuts and proposals, the faulty acceptance probability at each step) and the expected
    number of decisions the fault flips, sum |A - A'| (the coupled chains' chance to differ is at
    most this)."""
    log_weight, flips = 0.0, 0.0
    for log_ratio, correction, accepted in steps:
        a, a_fault = _accept_probability(log_ratio), _accept_probability(log_ratio - correction)
        flips += abs(a - a_fault)
        if accepted:
            log_weight += math.log(a_fault / a) if a_fault > 0.0 else -math.inf
        else:
            log_weight += math.log((1.0 - a_fault) / (1.0 - a)) if a_fault < 1.0 else -math.inf
    return math.exp(log_weight), flips


@dataclass
class FaultPower:
    """validate's power against the fault (the length correction dropped), from the serial side's
    recorded decisions: see the module's docstring."""

    samples_per_side: int
    level: float  # each difference test's level (alpha_level / number of statistics)
    flips_per_chain: float  # expected MH decisions the fault changes, per chain
    power_bound: float  # no test on these samples can detect the fault with a higher probability
    shift: dict[str, float]  # each statistic's expected difference (faulty - correct)
    power_by_statistic: dict[str, float]  # each difference test's power against that shift
    samples_for_target: dict[str, int | None]  # per side, for POWER_TARGET with that statistic alone
    effective_samples: float  # of the importance weights (the estimate's own precision)

    @property
    def power(self) -> float:
        """The best single test's power (at least the chance that some test detects it), capped by the bound."""
        return min(self.power_bound, max(self.power_by_statistic.values(), default=0.0))

    @property
    def samples_needed(self) -> int | None:
        """Samples per side for POWER_TARGET with the most sensitive statistic; None: unreachable."""
        found = [n for n in self.samples_for_target.values() if n is not None]
        best = min(found) if found else None
        if best is None or self.flips_per_chain * best + self.level < POWER_TARGET:
            # the bound: fewer flips than that and no test can have the power
            needed_by_bound = math.ceil((POWER_TARGET - self.level) / self.flips_per_chain) if self.flips_per_chain > 0 else None
            if best is None or needed_by_bound is None:
                return None
            best = max(best, needed_by_bound)
        return best

    def to_json(self) -> dict:
        return {**asdict(self), "power": self.power, "samples_needed": self.samples_needed, "target": POWER_TARGET}


def fault_power(
    samples: Sequence[Mapping[str, float]], steps: Sequence[Sequence[tuple[float, float, bool]]], n: int, level: float
) -> FaultPower:
    """Power against the fault with n samples per side, from the serial samples and their chains' steps."""
    weighed = [fault_weights(s) for s in steps]
    w = np.array([x for x, _ in weighed], dtype=float)
    flips = float(np.mean([f for _, f in weighed])) if weighed else 0.0
    total = float(w.sum())
    shift: dict[str, Any] = {}
    power: dict[str, Any] = {}
    needed: dict[str, Any] = {}
    for name in STATISTICS:
        v = np.array([s[name] for s in samples], dtype=float)
        sd = float(v.std(ddof=1)) if len(v) > 1 else 0.0
        if total <= 0.0:
            shift[name], power[name], needed[name] = 0.0, level, None
            continue
        faulty_mean = float((w * v).sum() / total)
        faulty_sd = float(math.sqrt(max(0.0, (w * (v - faulty_mean) ** 2).sum() / total)))
        shift[name] = faulty_mean - float(v.mean())
        if abs(shift[name]) <= 1e-12 * max(1.0, abs(float(v.mean()))):
            shift[name] = 0.0
        power[name] = difference_power(shift[name], sd, faulty_sd, n, level)
        needed[name] = samples_for_power(shift[name], math.sqrt((sd**2 + faulty_sd**2) / 2.0), level)
    ess = float(total**2 / (w**2).sum()) if total > 0 else 0.0
    bound = min(1.0, level * len(STATISTICS) + n * flips)
    return FaultPower(n, level, flips, bound, shift, power, needed, ess)


# --- the run -----------------------------------------------------------------------------
def sample_statistics(result: SampleResult, alpha: float, eos_token_id: int | None = None) -> dict[str, float]:
    logp0 = np.asarray(result.logp0, dtype=float)
    length = len(result.token_ids)
    return {
        "mean_logp0": float(logp0.mean()) if length else 0.0,
        "length": float(length),
        "alpha_logp0": float(alpha * logp0.sum()),
        "acceptance_rate": result.stats.acceptance_rate,
        "eos": float(length > 0 and eos_token_id is not None and result.token_ids[-1] == eos_token_id),
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
    power: dict | None = None  # FaultPower.to_json(): power against the fault, from the serial side's decisions

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
        power = (self.power or {}).get("power_by_statistic", {})
        headers = ["statistic", "serial", "prefetch", "difference", f"{1 - 2 * self.alpha_level:.0%} CI", "margin",
                   "p (TOST)", "p (differ)", *(["power vs fault"] if power else []), "verdict"]  # fmt: skip
        body = [
            [
                r["statistic"],
                _num(r["mean_serial"]),
                _num(r["mean_prefetch"]),
                _num(r["difference"], "+"),
                f"[{_num(r['ci_low'], '+')}, {_num(r['ci_high'], '+')}]",
                f"±{_num(r['margin'])} ({r['margin_kind']})",
                f"{r['p_value']:.3g}",
                f"{r['p_difference']:.3g}",
                *([f"{power[r['statistic']]:.2f}" if r["statistic"] in power else "-"] if power else []),
                r["verdict"],
            ]
            for r in self.rows
        ]
        return format_table(headers, body)

    def power_line(self) -> str | None:
        """One line on the power against the fault, or None where it was not measured."""
        if not self.power:
            return None
        p = self.power
        best = max(p["power_by_statistic"], key=p["power_by_statistic"].get)
        needed = p["samples_needed"]
        return (f"power against the fault (length correction dropped): {p['power']:.2f} at {p['samples_per_side']} per side "
                f"(best: {best}); the fault changes {p['flips_per_chain']:.3g} MH decisions per chain here, so no test "
                f"on these samples can exceed {p['power_bound']:.2f}; "
                + (f"about {needed} per side give {p['target']:.0%}" if needed and needed <= FEASIBLE_SAMPLES else
                   f"no feasible run reaches {p['target']:.0%} ({_needed_text(needed)}): on this config the fault barely changes the law"))


FEASIBLE_SAMPLES = 1_000_000  # per side: beyond this a run is no remedy


def _needed_text(needed: int | None) -> str:
    return "no sample size would" if needed is None else f"about {needed:.2g} samples per side would"


def _num(x: float, sign: str = "") -> str:
    """4 significant digits, without exponents for the small differences a table shows."""
    return f"{x:{sign}.4g}" if x == 0 or abs(x) >= 1e-3 else f"{x:{sign}.5f}"


def _run_side(
    backend: Backend, prompts: Sequence[tuple[str, Sequence[int]]], side_config: SamplerConfig, s: int, seed: int,
    chains: range, alpha: float, kernel_factory: Callable[[SamplerConfig], PowerMHKernel] | None,
) -> tuple[list[dict], list[int]]:
    """Chains `chains` of every prompt on side s (seed derive_seed(seed, s, i, c)): their statistics and seeds."""
    work = [(pid, tokens, i, c) for i, (pid, tokens) in enumerate(prompts) for c in chains]
    seeds = [derive_seed(seed, s, i, c) for _, _, i, c in work]
    results = backend.sample(
        [tokens for _, tokens, _, _ in work], [side_config.model_copy(update={"seed": x}) for x in seeds], kernel_factory=kernel_factory
    )
    eos = backend.tokenizer.eos_token_id
    rows = [{"prompt_id": pid, "chain": c, "seed": x, **sample_statistics(r, alpha, eos)} for (pid, _, _, c), x, r in zip(work, seeds, results)]
    return rows, seeds


def _in_prompt_order(rows: list[dict], prompts: Sequence[tuple[str, Sequence[int]]]) -> list[dict]:
    order = {pid: i for i, (pid, _) in enumerate(prompts)}
    return sorted(rows, key=lambda r: (order[r["prompt_id"]], r["chain"]))


def run_validation(
    backend: Backend,
    prompts: Sequence[tuple[str, Sequence[int]]],
    config: SamplerConfig,
    *,
    chains_per_prompt: int,
    max_chains_per_prompt: int | None = None,
    margins: Margins = Margins(),
    alpha_level: float = DEFAULT_ALPHA_LEVEL,
    fault: bool = False,
    progress: Callable[[str], None] | None = None,
) -> ValidationReport:
    """Serial PowerMH vs `config`'s schedule on `prompts` ((id, token ids) pairs), independent seeds.

    Chain c of prompt i on side s has seed derive_seed(config.seed, s, i, c): the two sides never
    share a seed, and a rerun draws the same samples. The serial side runs first, recording its
    MH decisions (its kernel is the config's, without early rejection, so every step's ratio is
    known): the power against the fault follows from them. With `max_chains_per_prompt` above
    `chains_per_prompt`, a run whose power against the fault is below POWER_TARGET is extended to
    the chains that reach it, where at most that many do (the serial side's next chains, then the
    prefetching side at the final count).
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
    level = alpha_level / len(STATISTICS)  # each difference test's share (Bonferroni)
    recorder = DecisionRecorder()
    start = time.perf_counter()
    if progress:
        progress(f"serial: {chains_per_prompt * len(prompts)} chains")
    serial, _ = _run_side(backend, prompts, sides["serial"], 0, config.seed, range(chains_per_prompt), config.alpha, recorder)
    chains = chains_per_prompt
    power = fault_power(serial, [recorder.by_seed.get(r["seed"], []) for r in serial], chains * len(prompts), level)
    # grown while the prediction (refined by each growth's chains) says more chains reach the target
    for _ in range(MAX_GROWTHS):
        needed = power.samples_needed
        if max_chains_per_prompt is None or needed is None or power.power >= POWER_TARGET:
            break
        wanted = max(chains + 1, math.ceil(needed / len(prompts)))
        if wanted > max_chains_per_prompt:
            if needed <= FEASIBLE_SAMPLES:  # beyond that the power line says it: no run would do
                notes.append(f"about {needed} samples per side would give {POWER_TARGET:.0%} power against the fault; "
                             f"at most {max_chains_per_prompt * len(prompts)} were allowed (--max-samples)")  # fmt: skip
            break
        if progress:
            progress(f"serial: {(wanted - chains) * len(prompts)} more chains: about {needed} samples per side give "
                     f"{POWER_TARGET:.0%} power against the fault (predicted from the serial chains' decisions)")  # fmt: skip
        more, _ = _run_side(backend, prompts, sides["serial"], 0, config.seed, range(chains, wanted), config.alpha, recorder)
        serial, chains = _in_prompt_order(serial + more, prompts), wanted
        power = fault_power(serial, [recorder.by_seed.get(r["seed"], []) for r in serial], chains * len(prompts), level)
    wall = {"serial": time.perf_counter() - start}
    if progress:
        progress(f"prefetch: {chains * len(prompts)} chains")
    start = time.perf_counter()
    prefetch, _ = _run_side(backend, prompts, sides["prefetch"], 1, config.seed, range(chains), config.alpha,
                            faulty_kernel if fault else None)  # fmt: skip
    wall["prefetch"] = time.perf_counter() - start
    samples = {"serial": serial, "prefetch": prefetch}
    n = len(serial)
    half_width = 1.6449 * math.sqrt(2.0 / n)  # in pooled sd, large-sample quantile at alpha 0.05
    if not margins.absolute and half_width > 0.6 * margins.sd:
        notes.append(
            f"{n} samples per side: a 90% interval spans about ±{half_width:.2f} sd, so even equal laws pass a "
            f"{margins.sd:g} sd margin only while the observed difference stays below {max(0.0, margins.sd - half_width):.2f} sd; "
            f"about {samples_needed(margins)} samples per side give equal laws a 95% chance per statistic"
        )
    if power.power < POWER_TARGET:
        notes.append(
            f"power against the fault is {power.power:.2f}: this run cannot reliably tell the fault from a correct kernel "
            f"(it changes {power.flips_per_chain:.3g} MH decisions per chain on this config)"
        )
    rows = []
    for name in STATISTICS:
        a = [x[name] for x in serial]
        b = [x[name] for x in prefetch]
        margin, kind = margins.margin(name, a, b)
        t = tost(a, b, margin, alpha_level)
        p_difference = welch_difference(a, b)
        shown = p_difference < level
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
                "p_difference": p_difference,  # Welch, two-sided, H0: equal means
                "difference_level": level,
                "difference_shown": shown,
                "df": t.df if math.isfinite(t.df) else None,
                "n_serial": t.n_a,
                "n_prefetch": t.n_b,
                "equivalent": t.equivalent and not shown,
                "verdict": row_verdict(t, shown),
            }
        )
    return ValidationReport(
        config=config.model_dump(),
        prompts=[pid for pid, _ in prompts],
        chains_per_prompt=chains,
        alpha_level=alpha_level,
        fault=fault,
        rows=rows,
        samples=samples,
        wall_time_s=wall,
        notes=notes,
        power=power.to_json(),
    )
