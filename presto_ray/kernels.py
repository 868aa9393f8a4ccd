"""MH acceptance ratios (ALGORITHM.md section 2)."""

from __future__ import annotations

import math

from presto_ray.engines.base import Completion
from presto_ray.state import ChainState


class PowerMHKernel:
    """log r for the suffix proposal y = x[:c] + s targeting p0**alpha with proposal q_tau."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha

    def log_accept_ratio(self, state: ChainState, cut: int, proposal: Completion) -> float:
        target = self.alpha * (float(proposal.logp0.sum()) - state.suffix_logp0(cut))
        proposal_correction = state.suffix_logq(cut) - float(proposal.logq.sum())
        return target + proposal_correction + self.cut_correction(len(state), cut + len(proposal.token_ids))

    @staticmethod
    def cut_correction(len_x: int, len_y: int) -> float:
        """log|x| - log|y|: the cut is uniform on |x| positions forward and |y| backward."""
        return math.log(len_x) - math.log(len_y)
