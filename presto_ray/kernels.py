"""MH kernels (docs/algorithm.md; derivations in docs/samplers.md): cut laws, PowerMH, EntropyCut and MultiTryMH.

A kernel turns (state, cut, proposals) into the next state. Every ratio is

    log r = [target and proposal terms] + log P(cut | y) - log P(cut | x)

where the cut law's term is log|x| - log|y| for the uniform cut (PowerMH) and
log lambda(c; y) - log lambda(c; x) for EntropyCut.

Where exact early rejection's bound holds (1/alpha <= tau <= 1, PowerMH and EntropyCut), the
ratio is computed in the form the bound bounds (presto_ray/early_rejection.py): the same law,
whether or not a schedule stops proposals early.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from presto_ray.early_rejection import (
    RejectionBound,
    bound_holds,
    clamped_sum,
    in_order_cut_log_prob,
    jump_total,
    weight_difference,
)
from presto_ray.config import SamplerConfig
from presto_ray.engines.base import Completion
from presto_ray.keys import StepKeys
from presto_ray.state import ChainState


class UniformCut:
    """c uniform on {0, ..., |x| - 1}."""

    needs_entropy = False

    def draw(self, u: float, state: ChainState) -> int:
        return self.draw_for_length(u, len(state))

    @staticmethod
    def draw_for_length(u: float, length: int) -> int:
        return math.floor(u * length)

    def log_prob(self, cut: int, state: ChainState) -> float:
        return -math.log(len(state))

    def log_prob_in_order(self, cut: int, state: ChainState) -> float:
        """The form early rejection bounds: the same float."""
        return -math.log(len(state))


class EntropyCut:
    """lambda(m; x) proportional to max(0, H_m - H_{m-1}) ** beta, uniform when every jump is 0.

    H_m is the entropy of p0's next-token distribution at generated position m; H_{-1} = 0, so
    the first position weighs its own entropy. The cut depends on the state only through the
    entropies of its prefix positions, and stays a deterministic function of (U_j, x).
    """

    needs_entropy = True

    def __init__(self, beta: float = 4.0) -> None:
        self.beta = beta

    def weights(self, entropy: np.ndarray) -> np.ndarray:
        jumps = np.maximum(0.0, np.diff(entropy, prepend=0.0)) ** self.beta
        total = jumps.sum()
        if not total > 0.0:
            return np.full(len(entropy), 1.0 / len(entropy))
        return jumps / total

    def draw(self, u: float, state: ChainState) -> int:
        return self.draw_from_entropy(u, state.entropy)

    def draw_from_entropy(self, u: float, entropy: np.ndarray) -> int:
        cdf = np.cumsum(self.weights(entropy))
        return min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), len(entropy) - 1)

    def log_prob(self, cut: int, state: ChainState) -> float:
        w = self.weights(state.entropy)[cut]
        return math.log(w) if w > 0.0 else -math.inf

    def log_prob_in_order(self, cut: int, state: ChainState) -> float:
        """log lambda(cut; state) with the normaliser summed in position order, the form early
        rejection bounds (its partial sums only grow as a proposal's positions arrive)."""
        return in_order_cut_log_prob(cut, state.entropy, self.beta)


@dataclass
class Transition:
    state: ChainState
    log_ratio: float
    accepted: bool


def _log_sum_exp(values: Sequence[float]) -> float:
    peak = max(values)
    if math.isinf(peak):  # -inf: every weight is 0; +inf: one weight dominates (inf - inf would be nan)
        return peak
    return peak + math.log(sum(math.exp(v - peak) for v in values))


class PowerMHKernel:
    """Suffix proposal y = x[:c] + s, s ~ q_tau, targeting p0**alpha.

    `tau` (the proposal temperature) enables the clamped ratio and `rejection_bound` where
    1/alpha <= tau <= 1; without it the ratio is the plain difference of log weights.
    """

    num_tries = 1
    _has_rejection_bound = True  # MultiTryMH: no bound (docs/samplers.md#exact-early-rejection)

    def __init__(self, alpha: float, cut_law: UniformCut | EntropyCut | None = None, tau: float | None = None) -> None:
        self.alpha = alpha
        self.cut_law = cut_law or UniformCut()
        self.tau = tau

    @property
    def clamped_ratio(self) -> bool:
        """The ratio sums min(g, 0) per token in token order (and EntropyCut's normaliser in
        position order): every g <= 0 here, so this is the same law, and the very expression
        `rejection_bound` bounds, whether or not early rejection is used."""
        return self._has_rejection_bound and bound_holds(self.alpha, self.tau)

    @property
    def needs_entropy(self) -> bool:
        return self.cut_law.needs_entropy

    def cut_correction(self, state: ChainState, cut: int, candidate: ChainState) -> float:
        """log P(cut | y) - log P(cut | x): the reverse move picks the same cut from y."""
        if self.clamped_ratio:
            return self.cut_law.log_prob_in_order(cut, candidate) - self.cut_law.log_prob_in_order(cut, state)
        return self.cut_law.log_prob(cut, candidate) - self.cut_law.log_prob(cut, state)

    def log_weight(self, logp0_sum: float, logq_sum: float) -> float:
        """log of pi/q on a suffix: alpha log p0 - log q_tau."""
        return self.alpha * logp0_sum - logq_sum

    def log_accept_ratio(self, state: ChainState, cut: int, proposal: Completion) -> float:
        return self._log_ratio(state, cut, proposal, state.replace_suffix(cut, proposal))

    def log_weight_difference(self, forward: tuple[float, float], backward: tuple[float, float]) -> float:
        """log w(forward) - log w(backward) for (log p0 sum, log q sum) pairs, without overflow.

        The weights are subtracted as they are (so every ratio that did not overflow keeps its
        exact floating-point value); when alpha * log p0 overflowed to the same infinity on both
        sides (inf - inf = nan), the sums are subtracted first. A difference still undefined
        (both suffixes impossible under p0) is a rejection.
        """
        difference = self.log_weight(*forward) - self.log_weight(*backward)
        if math.isnan(difference):
            difference = self.alpha * (forward[0] - backward[0]) - (forward[1] - backward[1])
        return -math.inf if math.isnan(difference) else difference

    def _log_ratio(self, state: ChainState, cut: int, proposal: Completion, candidate: ChainState) -> float:
        if self.clamped_ratio:  # the order RejectionBound.log_ratio_bound follows
            forward_sum = clamped_sum(self.alpha, proposal.logp0, proposal.logq)
            backward_sum = clamped_sum(self.alpha, state.logp0[cut:], state.logq[cut:])
            return weight_difference(forward_sum, backward_sum) + self.cut_correction(state, cut, candidate)
        forward = (float(proposal.logp0.sum()), float(proposal.logq.sum()))
        backward = (state.suffix_logp0(cut), state.suffix_logq(cut))
        return self.log_weight_difference(forward, backward) + self.cut_correction(state, cut, candidate)

    def transition(self, state: ChainState, cut: int, proposals: Sequence[Completion], keys: StepKeys) -> Transition:
        candidate = state.replace_suffix(cut, proposals[0])
        log_ratio = self._log_ratio(state, cut, proposals[0], candidate)
        accepted = math.log(keys.accept_uniform) < log_ratio
        return Transition(candidate if accepted else state, log_ratio, accepted)

    def rejection_bound(
        self, state: ChainState, cut: int, accept_uniform: float, candidate_length: int | None = None
    ) -> RejectionBound | None:
        """The bound on this step's log ratio as the proposal from x[:cut] arrives, or None where
        none holds (tau outside [1/alpha, 1], MultiTryMH, a subclass with its own ratio).

        `accept_uniform` is the step's keyed V_j; `candidate_length` the proposal state's length
        |y| when it is known in advance (fixed length: cut + max_new_tokens), else None (EOS may
        end it; the bound then uses |y| >= cut + m).
        """
        if not self.clamped_ratio or not self._ratio_is_this_class():
            return None
        beta = self.cut_law.beta if isinstance(self.cut_law, EntropyCut) else None
        prefix_total, prefix_last = jump_total(state.entropy[:cut], beta) if beta is not None else (0.0, 0.0)
        return RejectionBound(
            alpha=self.alpha,
            log_accept_uniform=math.log(accept_uniform),
            cut=cut,
            current_weight=clamped_sum(self.alpha, state.logp0[cut:], state.logq[cut:]),
            current_cut_log_prob=self.cut_law.log_prob_in_order(cut, state),
            candidate_length=candidate_length,
            entropy_beta=beta,
            prefix_jump_total=prefix_total,
            prefix_last_entropy=prefix_last,
        )

    def _ratio_is_this_class(self) -> bool:
        """The bound is derived for this class's ratio: a subclass that changes it (validate's
        fault kernels drop the cut correction) gets none."""
        own = ("transition", "_log_ratio", "cut_correction", "log_weight")
        return all(getattr(type(self), name) is getattr(PowerMHKernel, name) for name in own)


class MultiTryKernel(PowerMHKernel):
    """Multiple-try Metropolis with M independent tries from one cut (derivation in docs/samplers.md).

    Given the cut, every try is an independent draw from q_tau(. | x[:c]), so the tries that
    were not selected serve as the reference set (Liu, Liang and Wong 2000): with importance
    weights w(z) = pi(z) / q(z) on the suffix and W = sum_i w(y_i),

        A = min(1, P(c | y) W / (P(c | x) (W - w(y) + w(x)))).
    """

    _has_rejection_bound = False  # no bound is derived for its ratio: computed in the plain form, whatever tau

    def __init__(
        self, alpha: float, num_tries: int, cut_law: UniformCut | EntropyCut | None = None, tau: float | None = None
    ) -> None:
        super().__init__(alpha, cut_law, tau)
        self.num_tries = num_tries

    def transition(self, state: ChainState, cut: int, proposals: Sequence[Completion], keys: StepKeys) -> Transition:
        weights = [self.log_weight(float(p.logp0.sum()), float(p.logq.sum())) for p in proposals]
        total = _log_sum_exp(weights)
        selected = self._select(weights, total, keys.selection_uniform)
        candidate = state.replace_suffix(cut, proposals[selected])
        current = self.log_weight(state.suffix_logp0(cut), state.suffix_logq(cut))
        reverse = _log_sum_exp([w for i, w in enumerate(weights) if i != selected] + [current])
        log_ratio = total - reverse
        log_ratio = (-math.inf if math.isnan(log_ratio) else log_ratio) + self.cut_correction(state, cut, candidate)
        accepted = math.log(keys.accept_uniform) < log_ratio
        return Transition(candidate if accepted else state, log_ratio, accepted)

    @staticmethod
    def _select(weights: Sequence[float], total: float, u: float) -> int:
        """Try i with probability w_i / W, by inverse CDF on the keyed uniform."""
        cumulative = 0.0
        for i, w in enumerate(weights):
            cumulative += math.exp(w - total)
            if u < cumulative:
                return i
        return len(weights) - 1


def build_kernel(config: SamplerConfig) -> PowerMHKernel:
    cut_law = EntropyCut(config.entropy_beta) if config.sampler == "entropy_cut" else UniformCut()
    if config.sampler == "multi_try":
        return MultiTryKernel(config.alpha, config.num_tries, cut_law, config.tau)
    return PowerMHKernel(config.alpha, cut_law, config.tau)
