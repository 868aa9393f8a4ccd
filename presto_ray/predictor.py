"""Edge predictor: P(certain accept), P(certain reject), P(uncertain) from the cut fraction.

A 3-class softmax on c/T (class order accept / reject / uncertain). It starts from the paper's
published fit and, when asked, refits online with scikit-learn from the edges its chain observes;
the prior enters the refit as weighted pseudo-edges so that a few observations cannot swing it.
"""

from __future__ import annotations

from collections import deque
from functools import cache

import numpy as np
from threadpoolctl import ThreadpoolController

ACCEPT, REJECT, UNCERTAIN = 0, 1, 2
PAPER_INTERCEPTS = np.array([-0.780255, 2.041824, -1.261570])
PAPER_SLOPES = np.array([1.128515, -2.920097, 1.791582])
_PRIOR_GRID = np.linspace(0.0, 1.0, 21)


@cache
def _thread_pools() -> ThreadpoolController:
    return ThreadpoolController()  # scans the loaded BLAS and OpenMP libraries once (~17 ms)


def _softmax_rows(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


class EdgePredictor:
    def __init__(
        self,
        eps: float = 0.01,
        refit: bool = True,
        refit_every: int = 32,
        prior_strength: float = 64.0,
        memory: int = 4096,
    ) -> None:
        self.eps = eps
        self.refit = refit
        self.refit_every = refit_every
        self.prior_strength = prior_strength
        self.intercepts = PAPER_INTERCEPTS.copy()
        self.slopes = PAPER_SLOPES.copy()
        self._features: deque[float] = deque(maxlen=memory)
        self._labels: deque[int] = deque(maxlen=memory)
        self._since_fit = 0
        self.num_fits = 0

    def class_probabilities(self, cut_fraction: float | np.ndarray) -> np.ndarray:
        x = np.asarray(cut_fraction, dtype=float)[..., None]
        return _softmax_rows(self.intercepts + self.slopes * x)

    def accept_branch_probability(self, cut_fraction: float, accept_uniform: float | None = None) -> float:
        """The probability of the accept branch: h+ = (1 + P_acc - P_rej) / 2 (an uncertain edge
        accepts half the time), or, given the step's acceptance uniform V (the step accepts iff
        V < its acceptance probability A), P_acc + P_unc (1 - V): an uncertain edge's A taken
        as uniform, so it accepts with probability 1 - V. Averaged over V it is h+ again.

        The uniform is keyed, so the planner knows it before the proposal exists. Measured on
        the virtual clock (24 one-chain rows, T 96, K 10/24/100, budgets 8/20, fixed and EOS):
        streaming 1.1% faster (geometric mean; +1-7% at budget 20, up to -1% at budget 8) with
        0.6% more tokens; rounds unchanged; K 10 latency with EOS 1.49x -> 1.44x plain.
        """
        p = self.class_probabilities(cut_fraction)
        if accept_uniform is not None:
            return float(p[ACCEPT] + p[UNCERTAIN] * min(1.0, max(0.0, 1.0 - accept_uniform)))
        return float((1.0 + p[ACCEPT] - p[REJECT]) / 2.0)

    def label(self, accept_probability: float) -> int:
        if accept_probability >= 1.0 - self.eps:
            return ACCEPT
        if accept_probability <= self.eps:
            return REJECT
        return UNCERTAIN

    def observe(self, cut_fraction: float, accept_probability: float) -> None:
        self._features.append(float(cut_fraction))
        self._labels.append(self.label(accept_probability))
        self._since_fit += 1
        if self.refit and self._since_fit >= self.refit_every:
            self.fit()

    def fit(self) -> None:
        """Refit on the observed edges plus the prior as pseudo-edges (deterministic)."""
        self._since_fit = 0
        prior = _softmax_rows(PAPER_INTERCEPTS + PAPER_SLOPES * _PRIOR_GRID[:, None])
        grid_x = np.repeat(_PRIOR_GRID, 3)
        grid_y = np.tile([ACCEPT, REJECT, UNCERTAIN], len(_PRIOR_GRID))
        # A vanishing prior still keeps all three classes present, so coef_ always has 3 rows.
        grid_w = prior.reshape(-1) * max(self.prior_strength, 1e-3) / len(_PRIOR_GRID)
        x = np.concatenate([grid_x, np.fromiter(self._features, float)])[:, None]
        y = np.concatenate([grid_y, np.fromiter(self._labels, int)])
        w = np.concatenate([grid_w, np.ones(len(self._labels))])
        # imported here: scikit-learn takes ~0.8 s to import, which every process that loads the
        # package (each Ray worker, each CLI run) would pay though most never fit
        from sklearn.linear_model import LogisticRegression

        model = LogisticRegression(C=100.0, max_iter=500)
        # BLAS on one thread: a 6-parameter problem gains nothing from more, and OpenBLAS's
        # threads spinning beside scikit-learn's made a fit ~5x the CPU time (29 -> 6 ms on 4,096
        # edges, 2 cores). The same coefficients (scripts/fingerprint.py). The limit is the
        # process's for the fit's few milliseconds: BLAS work in other threads then runs on one.
        with _thread_pools().limit(limits=1, user_api="blas"):
            model.fit(x, y, sample_weight=w)
        self.intercepts = model.intercept_.copy()
        self.slopes = model.coef_[:, 0].copy()
        self.num_fits += 1
