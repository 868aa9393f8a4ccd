"""validate's fault and its power against it.

The fault (`--fault`): the config's kernel without its cut-probability (length) correction
log|x| - log|y| (the published reference code's EOS bug, docs/algorithm.md section 7), injected
on the prefetching side through the drivers' `kernel_factory`: a chain with a wrong law.

The power against it is computed from the serial side's own MH decisions, at no extra sampling:
the serial chains run with a kernel that is the config's and records each step's log ratio and its
cut correction (`DecisionRecorder`), so the faulty kernel's acceptance probability of the same step
is known. The faulty chain's law relative to the serial one's is then a product of per-step
weights (A'/A for an accepted step, (1 - A')/(1 - A) for a rejected one), which gives each
statistic's expected shift under the fault (importance weights: no mixing assumption), the power of
each difference test against it at the run's size, the samples per side that give 90% power, and a
bound no test can beat: the coupled correct and faulty chains differ with probability at most the
expected number of flipped decisions per chain d, so any test on n samples per side has power at
most alpha + n d.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from presto_ray.config import SamplerConfig
from presto_ray.early_rejection import RejectionBound
from presto_ray.engines.base import Completion
from presto_ray.kernels import EntropyCut, MultiTryKernel, PowerMHKernel, Transition, UniformCut, build_kernel
from presto_ray.keys import StepKeys
from presto_ray.state import ChainState
from presto_ray.validate_stats import POWER_TARGET, STATISTICS, difference_power, samples_for_power

FEASIBLE_SAMPLES = 1_000_000  # per side: beyond this a run is no remedy


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
