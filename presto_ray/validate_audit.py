"""validate's decision audit: every MH step the prefetching side's kernel decides, decided again by
the config's reference kernel (`build_kernel(config)`) on the same inputs.

A transition is a pure function of (state, cut, proposals, keys), and an early-rejection bound of
(state, cut, V_j, candidate length): whatever the engine produced (on a GPU its tokens need not be
bit-exact), the kernel that judged them must be the config's. So the audit wraps the kernel a
schedule runs (what `kernel_factory` builds; validate's faulty kernel under `--fault`) and, per
chain, compares:

- each full transition: the log ratio, the decision, the next state, and the cut (drawn again by
  the reference's cut law from the state and the step's keyed U_j);
- each early-rejection bound the kernel gives: every field of the bound, and its cut. An
  early-rejected step is decided on one of these bounds (the walk's stopped-proposal check uses
  the bound the kernel gave for the walked state), so every step is audited: the full transitions
  audited and the early-rejected steps add up to the steps decided (`complete`).

Equality is exact: the reference runs the same code on the same floats, and IEEE arithmetic is
deterministic, so a correct kernel agrees to the bit (nan only with nan, both a rejection). A
kernel that drops the length correction differs by log|x| - log|y| on every step that changes
the length (at least log(T/(T-1)) for a horizon of T tokens), and its bound by the candidate
length it assumes, however rarely that flips a decision. The law tests cannot see such a fault
where it flips too few decisions (validate_fault.py measures how few); this check sees it exactly.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Callable, Sequence

from presto_ray.config import SamplerConfig
from presto_ray.early_rejection import RejectionBound
from presto_ray.engines.base import Completion
from presto_ray.kernels import PowerMHKernel, Transition, build_kernel
from presto_ray.keys import StepKeys, step_keys
from presto_ray.state import ChainState

KernelFactory = Callable[[SamplerConfig], PowerMHKernel]
KEPT_DISAGREEMENTS = 5  # the first ones of each kind are reported in full; all are counted


def _same(a: float, b: float) -> bool:
    """The same float (nan with nan: both are rejections)."""
    return a == b or (math.isnan(a) and math.isnan(b))


def _difference(a: float, b: float) -> float:
    return 0.0 if _same(a, b) else abs(a - b) if math.isfinite(a - b) else math.inf


@dataclass(frozen=True)
class Disagreement:
    """One step where the kernel and the reference disagree."""

    kind: str  # "transition", "bound" or "cut"
    seed: int  # the chain's seed
    step: int | None  # the MH step j (None where the keys match no step of the chain)
    cut: int
    state_length: int
    detail: str  # what differs, kernel's value first
    difference: float | None  # |kernel - reference| of the log ratio (transition) or the largest differing field (bound)


@dataclass
class DecisionAudit:
    """The audit of one side: what was re-decided and what disagreed. `factory(inner)` wraps a
    kernel factory (None: the config's kernel) so that every chain it builds is audited here."""

    full_transitions: int = 0
    bounds: int = 0
    disagreement_count: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)  # disagreements per kind: transition, bound, cut
    decisions_differing: int = 0  # transitions whose accept/reject itself differs
    bound_fields: set[str] = field(default_factory=set)  # the fields in which bounds differed
    largest_log_ratio_difference: float = 0.0
    largest_bound_difference: float = 0.0
    first: list[Disagreement] = field(default_factory=list)

    def factory(self, inner: KernelFactory | None = None) -> KernelFactory:
        def build(config: SamplerConfig) -> PowerMHKernel:
            kernel = inner(config) if inner is not None else build_kernel(config)
            return AuditedKernel(kernel, build_kernel(config), self, config)

        return build

    @property
    def agrees(self) -> bool:
        return self.disagreement_count == 0

    def record(self, disagreement: Disagreement) -> None:
        self.disagreement_count += 1
        self.by_kind[disagreement.kind] = self.by_kind.get(disagreement.kind, 0) + 1
        if self.by_kind[disagreement.kind] <= KEPT_DISAGREEMENTS:
            self.first.append(disagreement)
        if disagreement.difference is not None and disagreement.kind != "cut":
            if disagreement.kind == "transition":
                self.largest_log_ratio_difference = max(self.largest_log_ratio_difference, disagreement.difference)
            else:
                self.largest_bound_difference = max(self.largest_bound_difference, disagreement.difference)

    def to_json(self, transitions: int, early_rejected_steps: int) -> dict:
        """The audit for the report, given the side's decided steps and its early-rejected ones
        (the chains' own counts): complete when the audited full transitions and the early-rejected
        steps are every step decided."""
        return {
            "reference": "the config's kernel (build_kernel), on the same inputs",
            "tolerance": 0.0,
            "steps": transitions,
            "full_transitions": self.full_transitions,
            "early_rejected_steps": early_rejected_steps,
            "bounds": self.bounds,
            "complete": self.full_transitions + early_rejected_steps == transitions,
            "disagreements": self.disagreement_count,
            "disagreements_by_kind": dict(sorted(self.by_kind.items())),
            "decisions_differing": self.decisions_differing,
            "bound_fields_differing": sorted(self.bound_fields),
            "largest_log_ratio_difference": _finite(self.largest_log_ratio_difference),
            "largest_bound_difference": _finite(self.largest_bound_difference),
            "first_disagreements": [{**asdict(d), "difference": _finite(d.difference)} for d in self.first],
        }


def _finite(x: float | None) -> float | str | None:
    """JSON has no infinity: an infinite difference is written "inf"."""
    return x if x is None or math.isfinite(x) else "inf"


def _bound_difference(
    kernel: RejectionBound | None, reference: RejectionBound | None
) -> tuple[list[str], str, float | None] | None:
    """None when the bounds are the same; else the fields that differ, how, and the largest
    difference of a numeric field both give (None where only a missing value differs)."""
    if kernel is None or reference is None:
        if kernel is None and reference is None:
            return None
        return ["bound"], f"bound {'none' if kernel is None else 'given'} vs {'none' if reference is None else 'given'}", None
    differing, details, largest = [], [], None
    for f in fields(RejectionBound):
        a, b = getattr(kernel, f.name), getattr(reference, f.name)
        if (a is None) != (b is None) or (a is not None and not _same(float(a), float(b))):
            differing.append(f.name)
            details.append(f"{f.name} {a!r} vs {b!r}")
            if a is not None and b is not None:
                largest = max(largest or 0.0, _difference(float(a), float(b)))
    return (differing, "; ".join(details), largest) if differing else None


class AuditedKernel(PowerMHKernel):
    """A kernel that is `kernel` (every value the chain and its planner read is `kernel`'s) and
    checks each decision against `reference` into `audit`."""

    def __init__(self, kernel: PowerMHKernel, reference: PowerMHKernel, audit: DecisionAudit, config: SamplerConfig) -> None:
        # no super().__init__: every attribute a chain or planner reads is the audited kernel's
        self.inner, self.reference, self.audit = kernel, reference, audit
        self.alpha, self.cut_law, self.tau, self.num_tries = kernel.alpha, kernel.cut_law, kernel.tau, kernel.num_tries
        self.seed = config.seed
        self._steps = config.num_blocks * config.mh_steps
        self._step_of: dict[float, int] | None = None

    @property
    def clamped_ratio(self) -> bool:
        return self.inner.clamped_ratio

    def cut_correction(self, state: ChainState, cut: int, candidate: ChainState) -> float:
        return self.inner.cut_correction(state, cut, candidate)

    def log_weight(self, logp0_sum: float, logq_sum: float) -> float:
        return self.inner.log_weight(logp0_sum, logq_sum)

    def log_accept_ratio(self, state: ChainState, cut: int, proposal: Completion) -> float:
        return self.inner.log_accept_ratio(state, cut, proposal)

    def log_weight_difference(self, forward: tuple[float, float], backward: tuple[float, float]) -> float:
        return self.inner.log_weight_difference(forward, backward)

    def step_of(self, accept_uniform: float) -> int | None:
        """The chain's MH step whose keyed V_j this is (None: none of its steps)."""
        if self._step_of is None:
            self._step_of = {step_keys(self.seed, j).accept_uniform: j for j in range(self._steps)}
        return self._step_of.get(accept_uniform)

    def _check_cut(self, state: ChainState, cut: int, cut_uniform: float, step: int | None) -> None:
        reference = self.reference.cut_law.draw(cut_uniform, state)
        if reference != cut:
            self.audit.record(Disagreement("cut", self.seed, step, cut, len(state), f"cut {cut} vs {reference}", None))

    def transition(self, state: ChainState, cut: int, proposals: Sequence[Completion], keys: StepKeys) -> Transition:
        decided = self.inner.transition(state, cut, proposals, keys)
        reference = self.reference.transition(state, cut, proposals, keys)
        self.audit.full_transitions += 1
        step = self.step_of(keys.accept_uniform)
        self._check_cut(state, cut, keys.cut_uniform, step)
        if (
            not _same(decided.log_ratio, reference.log_ratio)
            or decided.accepted != reference.accepted
            or decided.state.tokens != reference.state.tokens
        ):
            detail = (f"log ratio {decided.log_ratio!r} vs {reference.log_ratio!r}, "
                      f"accepted {decided.accepted} vs {reference.accepted}")  # fmt: skip
            difference = _difference(decided.log_ratio, reference.log_ratio)
            self.audit.decisions_differing += decided.accepted != reference.accepted
            self.audit.record(Disagreement("transition", self.seed, step, cut, len(state), detail, difference))
        return decided

    def rejection_bound(
        self, state: ChainState, cut: int, accept_uniform: float, candidate_length: int | None = None
    ) -> RejectionBound | None:
        given = self.inner.rejection_bound(state, cut, accept_uniform, candidate_length=candidate_length)
        reference = self.reference.rejection_bound(state, cut, accept_uniform, candidate_length=candidate_length)
        self.audit.bounds += 1
        step = self.step_of(accept_uniform)
        if step is not None:
            self._check_cut(state, cut, step_keys(self.seed, step).cut_uniform, step)
        if (differs := _bound_difference(given, reference)) is not None:
            self.audit.bound_fields.update(differs[0])
            self.audit.record(Disagreement("bound", self.seed, step, cut, len(state), differs[1], differs[2]))
        return given


def audit_line(audit: dict) -> str:
    """One line for the console: what was audited and what disagreed."""
    counted = (f"decision audit: {audit['full_transitions']} full transitions and {audit['bounds']} early-rejection "
               f"bounds decided again by the config's kernel ({audit['early_rejected_steps']} early-rejected steps)")  # fmt: skip
    if not audit["complete"]:
        return counted + f": INCOMPLETE ({audit['steps']} steps were decided)"
    if audit["disagreements"] == 0:
        return counted + ": all agree, exactly"
    kinds = ", ".join(f"{n} {kind}s" for kind, n in audit["disagreements_by_kind"].items())
    found = [f"{audit['decisions_differing']} accept/reject decisions differ"]
    if audit["largest_log_ratio_difference"]:
        found.append(f"largest log-ratio difference {_text(audit['largest_log_ratio_difference'])}")
    if audit["bound_fields_differing"]:
        found.append(f"bounds differ in {', '.join(audit['bound_fields_differing'])}")
    return counted + f": {audit['disagreements']} DISAGREE ({kinds}; {'; '.join(found)})"


def _text(x: float | str) -> str:
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def disagreement_lines(audit: dict, per_kind: int = 2) -> list[str]:
    """The first few disagreeing steps of each kind, one line each."""
    shown: dict[str, int] = {}
    lines = []
    for d in audit["first_disagreements"]:
        shown[d["kind"]] = shown.get(d["kind"], 0) + 1
        if shown[d["kind"]] <= per_kind:
            lines.append(f"  {d['kind']} at chain seed {d['seed']}, step {d['step']}, cut {d['cut']} of a state of "
                         f"{d['state_length']} tokens: {d['detail']} (kernel vs reference)")  # fmt: skip
    return lines
