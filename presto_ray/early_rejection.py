"""Exact early rejection: an upper bound on an MH step's log ratio from a proposal's first tokens
(derivation in docs/samplers.md#exact-early-rejection).

Per token, g(t) = alpha log p0(t) - log q_tau(t). For 1/alpha <= tau <= 1 every g(t) <= 0, so the
proposal's part of the log ratio only falls as tokens arrive, and the cut law's part is bounded by
what the prefix already shows. The acceptance uniform V_j is keyed, known before the proposal
starts: once log V_j >= U_m (the bound after m tokens), the step is rejected whatever follows.

The bound must make the full ratio's decision in floating point, not only in exact arithmetic.
So the kernel (presto_ray/kernels.py), wherever the bound holds, computes its ratio from the very
terms bounded here: clamped per-token weights min(g, 0) summed in token order, and EntropyCut's
normaliser summed in position order. Adding a non-positive float never raises a running sum,
adding a non-negative one never lowers it, and a - b, a + b and a / b round monotonically in each
operand, so U_m >= the final log ratio holds for the computed floats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np


def bound_holds(alpha: float, tau: float | None) -> bool:
    """Every g(t) <= 0 exactly when 1/alpha <= tau <= 1 (g = (alpha - 1/tau) log p0 + log Z_{1/tau})."""
    return tau is not None and 1.0 / alpha <= tau <= 1.0


def clamped_log_weights(alpha: float, logp0: np.ndarray, logq: np.ndarray) -> np.ndarray:
    """min(g, 0) per token. nan (a token with log p0 = log q = -inf) stays nan: the step is then
    rejected, as today; a g above 0 (rounding, or log q underflowed to -inf) counts as 0."""
    weighted, logq = alpha * np.asarray(logp0, dtype=np.float64), np.asarray(logq, dtype=np.float64)
    if np.isinf(logq).any():  # -inf - -inf: nan, on purpose (numpy's errstate costs ~10 us a call)
        with np.errstate(invalid="ignore"):
            g = weighted - logq
    else:
        g = weighted - logq  # no invalid operation without an infinite log q
    return np.where(g > 0.0, 0.0, g)


def clamped_log_weight(alpha: float, logp0: float, logq: float) -> float:
    """One token's min(g, 0), the same float as clamped_log_weights gives it."""
    g = alpha * float(logp0) - float(logq)
    return 0.0 if g > 0.0 else g


def clamped_running_sums(alpha: float, logp0: np.ndarray, logq: np.ndarray) -> np.ndarray:
    """S_0 = 0.0, S_1, ..., S_m: the clamped weights added in token order from 0.0, the very floats
    `RunningBound.push` reaches (np.cumsum adds left to right)."""
    return np.cumsum(np.concatenate(([0.0], clamped_log_weights(alpha, logp0, logq))))


def clamped_sum(alpha: float, logp0: np.ndarray, logq: np.ndarray) -> float:
    """sum of min(g, 0) in token order (np.cumsum adds left to right; np.sum is pairwise, whose
    partial sums a streaming check could not reproduce)."""
    if len(logp0) == 0:
        return 0.0
    return float(np.cumsum(clamped_log_weights(alpha, logp0, logq))[-1])


def weight_difference(forward: float, backward: float) -> float:
    """forward - backward of clamped sums; undefined (both -inf, or a nan token) is a rejection."""
    difference = forward - backward
    return -math.inf if math.isnan(difference) else difference


# --- EntropyCut's cut law, in the order the bound can follow ---------------------------------
def entropy_jump(entropy: float, previous: float, beta: float) -> float:
    """max(0, H_m - H_{m-1}) ** beta for one position; nan stays nan (the law is then uniform)."""
    rise = float(entropy) - float(previous)
    if rise > 0.0:
        try:
            return float(rise**beta)
        except OverflowError:  # numpy's power gives inf where Python's raises
            return math.inf
    return rise if math.isnan(rise) else 0.0


def jump_total(
    entropy: Sequence[float] | np.ndarray, beta: float, total: float = 0.0, previous: float = 0.0
) -> tuple[float, float]:
    """(running sum of the jumps, last entropy) after `entropy`, continuing from (total, previous).
    Scalar arithmetic in position order, so a prefix's total is bit for bit the full sum's prefix."""
    for h in entropy:
        total = total + entropy_jump(h, previous, beta)
        previous = float(h)
    return total, previous


def in_order_cut_log_prob(cut: int, entropy: Sequence[float] | np.ndarray, beta: float) -> float:
    """log lambda(cut; x) with the normaliser summed in position order (EntropyCut.weights sums it
    pairwise; the two agree up to rounding)."""
    total, _ = jump_total(entropy, beta)
    if not total > 0.0:  # every jump 0 (or a nan): uniform
        return -math.log(len(entropy))
    previous = float(entropy[cut - 1]) if cut > 0 else 0.0
    share = entropy_jump(entropy[cut], previous, beta) / total
    return math.log(share) if share > 0.0 else -math.inf


def _log_rounded_up(value: float) -> float:
    """log(value) two ulps up: libm's log is faithful, not correctly rounded, so of two close
    arguments the smaller may get the larger log by an ulp; two ulps up covers it."""
    return math.nextafter(math.nextafter(math.log(value), math.inf), math.inf)


# --- the bound ----------------------------------------------------------------------------
@dataclass(frozen=True)
class RejectionBound:
    """U_m, the bound on step j's log ratio after m proposal tokens, for one (state, cut, V_j).

    Made by `PowerMHKernel.rejection_bound`. With S_m the clamped sum of the proposal's first m
    tokens (`clamped_log_weight`, added in token order from 0.0) and B_m >= log P(cut | y):

        U_m = (S_m - current_weight) + (B_m - current_cut_log_prob)     (nan -> rejected)

    evaluated in this order, the kernel's own order. B_m = -log(candidate_length or cut +
    max(m, 1)) for the uniform cut; EntropyCut's is `cut_log_prob_bound`. U_m never increases
    with m, and `rejects` (log V_j >= U_m) implies the full transition rejects.
    """

    alpha: float
    log_accept_uniform: float  # log V_j: the step accepts iff log V_j < log r
    cut: int
    current_weight: float  # clamped sum over the state's suffix x[cut:]
    current_cut_log_prob: float  # log P(cut | x), as the kernel computes it
    candidate_length: int | None = None  # |y| when known in advance (fixed length), else at least cut + m
    entropy_beta: float | None = None  # EntropyCut's beta; None for the uniform cut
    prefix_jump_total: float = 0.0  # EntropyCut: sum of the jumps of positions < cut (shared by x and y)
    prefix_last_entropy: float = 0.0  # EntropyCut: H_{cut-1} (0 when cut is 0)

    @property
    def threshold(self) -> float:
        """log V_j + current_weight + current_cut_log_prob: in exact arithmetic the step is rejected
        once S_m + B_m <= threshold (uniform cut, EOS-aware: S_m <= threshold + log(cut + m)).
        For a vectorised screen only (see docs/samplers.md): the float decision is `rejects`."""
        return self.log_accept_uniform + self.current_weight + self.current_cut_log_prob

    def cut_log_prob_bound(self, generated: int, first_jump: float = 0.0, jump_total: float = 0.0) -> float:
        """B_m >= log P(cut | y) given m = `generated` tokens; EntropyCut also needs the jump at the
        cut (y's first position) and the running jump total over y's first cut + m positions."""
        length = self.candidate_length if self.candidate_length is not None else self.cut + max(generated, 1)
        uniform = -math.log(length)  # |y| >= length, and log of distinct integers keeps their order
        if self.entropy_beta is None:
            return uniform
        if generated == 0:
            return 0.0  # lambda(cut; y) <= 1
        # lambda(cut; y) is first_jump / W_y with W_y >= jump_total (more non-negative jumps to
        # come), or 0, or 1/|y| (all of y's jumps 0, or a nan entropy makes the law uniform)
        share = first_jump / jump_total if jump_total > 0.0 else 0.0
        proportional = _log_rounded_up(share) if share > 0.0 else -math.inf
        return min(0.0, max(proportional, uniform))

    def log_ratio_bound(
        self, proposal_weight: float, generated: int, first_jump: float = 0.0, jump_total: float = 0.0
    ) -> float:
        """U_m from the running clamped sum S_m = `proposal_weight` of m = `generated` tokens."""
        difference = weight_difference(proposal_weight, self.current_weight)
        return difference + (self.cut_log_prob_bound(generated, first_jump, jump_total) - self.current_cut_log_prob)

    def rejects(self, proposal_weight: float, generated: int, first_jump: float = 0.0, jump_total: float = 0.0) -> bool:
        """Rejection is certain: not log V_j < U_m (nan counts as rejected, as in the kernel)."""
        return not self.log_accept_uniform < self.log_ratio_bound(proposal_weight, generated, first_jump, jump_total)

    def prefix_log_ratio_bound(
        self, logp0: np.ndarray, logq: np.ndarray, entropy: np.ndarray | None = None
    ) -> float:
        """U_m for a proposal's first m tokens given as arrays (m = len(logp0)): `RunningBound`'s
        float after m pushes. The uniform cut's in array operations (the clamped weights summed in
        token order from 0.0, as `first_rejection` sums them); EntropyCut's token by token."""
        if self.entropy_beta is None:
            return self.log_ratio_bound(float(clamped_running_sums(self.alpha, logp0, logq)[-1]), len(logp0))
        running = self.start()
        for i in range(len(logp0)):
            running.push(logp0[i], logq[i], None if entropy is None else entropy[i])
        return running.log_ratio_bound()

    def rejects_prefix(self, logp0: np.ndarray, logq: np.ndarray, entropy: np.ndarray | None = None) -> bool:
        return not self.log_accept_uniform < self.prefix_log_ratio_bound(logp0, logq, entropy)

    def first_rejection(self, logp0: np.ndarray, logq: np.ndarray) -> int | None:
        """The fewest of the tokens given as arrays after which `rejects` holds (None: never), in
        array operations with `RunningBound.push`'s floats: the running sum added in token order
        from 0.0, each U_m in the kernel's order. Uniform cut only (EntropyCut's normaliser is
        followed token by token: `RunningBound`)."""
        if self.entropy_beta is not None:
            raise ValueError("first_rejection follows the uniform cut only")
        count = len(logp0)
        if count == 0:
            return None
        sums = clamped_running_sums(self.alpha, logp0, logq)[1:]
        if math.isinf(self.current_weight):  # -inf - -inf: nan, which rejects below as weight_difference's -inf does
            with np.errstate(invalid="ignore"):
                difference = sums - self.current_weight
        else:
            difference = sums - self.current_weight
        if self.candidate_length is not None:
            cut_bound = np.full(count, -math.log(self.candidate_length))
        else:
            cut_bound = -np.array([math.log(self.cut + m) for m in range(1, count + 1)])  # cut_log_prob_bound's
        rejected = ~(self.log_accept_uniform < difference + (cut_bound - self.current_cut_log_prob))
        return int(rejected.argmax()) + 1 if rejected.any() else None

    def start(self) -> RunningBound:
        """An incremental check for one proposal, O(1) per token: what an engine runs."""
        return RunningBound(self, jump_total=self.prefix_jump_total, previous_entropy=self.prefix_last_entropy)


@dataclass
class RunningBound:
    """The bound followed token by token: push each generated token's (log p0, log q_tau, entropy),
    the very float64 values its Completion will hold; `push` says whether rejection is certain."""

    bound: RejectionBound
    proposal_weight: float = 0.0  # S_m
    generated: int = 0  # m
    first_jump: float = 0.0  # EntropyCut: the jump at y's position `cut`
    jump_total: float = 0.0  # EntropyCut: jumps of y's first cut + m positions, in order
    previous_entropy: float = 0.0
    rejected: bool = field(default=False)

    def push(self, logp0: float, logq: float, entropy: float | None = None) -> bool:
        self.proposal_weight = self.proposal_weight + clamped_log_weight(self.bound.alpha, logp0, logq)
        beta = self.bound.entropy_beta
        if beta is not None:
            h = 0.0 if entropy is None else float(entropy)  # ChainState.replace_suffix's default
            jump = entropy_jump(h, self.previous_entropy, beta)
            if self.generated == 0:
                self.first_jump = jump
            self.jump_total, self.previous_entropy = self.jump_total + jump, h
        self.generated += 1
        self.rejected = self.rejected or self.bound.rejects(
            self.proposal_weight, self.generated, self.first_jump, self.jump_total
        )
        return self.rejected

    def log_ratio_bound(self) -> float:
        return self.bound.log_ratio_bound(self.proposal_weight, self.generated, self.first_jump, self.jump_total)


# --- a request's stop rule: what an engine runs next to the tokens -----------------------------
class RequestStop:
    """Every bound a request carries, followed token by token (ProposalRequest.rejection_bounds:
    one per plan node that would use the request). `push` says when every one of them rejects:
    then no node can use the rest of the proposal and the engine may stop the request there.

    A request without bounds never stops. The chain checks a stopped completion again with the
    bound of the node that walks it (`RejectionBound.rejects_prefix`), so an engine that stops
    late, or never, changes only what is spent.
    """

    def __init__(self, bounds: Sequence[RejectionBound]) -> None:
        self._running = [bound.start() for bound in bounds]
        self.stopped = False

    def push(self, logp0: float, logq: float, entropy: float | None = None) -> bool:
        """One more generated token; True once every bound rejects (and from then on)."""
        if not self._running or self.stopped:
            return self.stopped
        # a rejected bound stays rejected: only the others need the token
        self.stopped = all([running.push(logp0, logq, entropy) for running in self._running if not running.rejected])
        if not self.stopped:
            self._running = [running for running in self._running if not running.rejected]
        return self.stopped

    def stop_length(self, logp0: np.ndarray, logq: np.ndarray, entropy: np.ndarray | None = None) -> int | None:
        """The token count after which every bound rejects, for tokens given as arrays (None: never)."""
        for i in range(len(logp0)):
            if self.push(logp0[i], logq[i], None if entropy is None else entropy[i]):
                return i + 1
        return None


def stop_length(
    bounds: Sequence[RejectionBound], logp0: np.ndarray, logq: np.ndarray, entropy: np.ndarray | None = None
) -> int | None:
    """`RequestStop(bounds).stop_length(...)`, in array operations where every bound follows the
    uniform cut: a bound stays rejected once it rejects, so the request stops where the last of
    them first rejects (None: no bounds, or one never rejects)."""
    if not bounds:
        return None
    if any(bound.entropy_beta is not None for bound in bounds):
        return RequestStop(bounds).stop_length(logp0, logq, entropy)
    firsts = [bound.first_rejection(logp0, logq) for bound in bounds]
    return None if None in firsts else max(firsts)  # type: ignore[type-var]
