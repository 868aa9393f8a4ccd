"""The chain's state: generated tokens with their exact per-token log p0 and log q_tau."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from presto_ray.engines.base import Completion

@dataclass(frozen=True)
class ChainState:
    tokens: tuple[int, ...] = ()
    logp0: np.ndarray = field(default_factory=lambda: np.zeros(0))
    logq: np.ndarray = field(default_factory=lambda: np.zeros(0))
    entropy: np.ndarray = field(default_factory=lambda: np.zeros(0))  # H of p0 at each position (EntropyCut)

    def __len__(self) -> int:
        return len(self.tokens)

    def ends_with(self, token_id: int | None) -> bool:
        return token_id is not None and len(self.tokens) > 0 and self.tokens[-1] == token_id

    def replace_suffix(self, cut: int, completion: Completion) -> "ChainState":
        """x[:cut] + the completion's tokens (cut == len(self) appends: an extension)."""
        return ChainState(
            self.tokens[:cut] + completion.token_ids,
            np.concatenate([self.logp0[:cut], completion.logp0]),
            np.concatenate([self.logq[:cut], completion.logq]),
            np.concatenate([self.entropy[:cut], completion.entropy if completion.entropy is not None else np.zeros(len(completion.token_ids))]),
        )

    def suffix_logp0(self, cut: int) -> float:
        return float(self.logp0[cut:].sum())

    def suffix_logq(self, cut: int) -> float:
        return float(self.logq[cut:].sum())
