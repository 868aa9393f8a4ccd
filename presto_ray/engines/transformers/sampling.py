"""From one decode step's logits to each sequence's token, its log p0, log q_tau and the entropy
of p0: exact, with no processor but the temperature (no top-k, top-p, min-p or penalties).

Everything is computed in float64 from the logits of the pass that generated the token:
log p0 = log_softmax(z), log q_tau = log_softmax(z / tau). The token wins an exponential race with
the row's keyed noise (noise.py): argmax_i q_tau(i) / E_i, which is i with probability q_tau(i).
Temperature 0 is greedy decoding: the first argmax of the logits, log q 0 (as the toy engine
reports it).

Rows are independent: every operation here reduces along the vocabulary of one row only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch


@dataclass(frozen=True)
class SampledRows:
    """One step's draws, one entry per sequence (float64 numpy, as Completions hold them)."""

    tokens: np.ndarray  # int64
    logp0: np.ndarray
    logq: np.ndarray
    entropy: np.ndarray | None  # None when no row asked for it


def sampling_device(device: torch.device) -> torch.device:
    """Where the float64 sampling math runs: the logits' device, but the CPU for MPS (no float64)."""
    return torch.device("cpu") if device.type == "mps" else device


def sample_rows(
    logits: torch.Tensor, temperatures: Sequence[float], exponentials: np.ndarray, want_entropy: bool
) -> SampledRows:
    """Draw one token for each of the first len(temperatures) rows of `logits` with that row of
    `exponentials` (rows of `logits` past them are padding: computed, never returned)."""
    n = len(temperatures)
    z = logits.to(device=sampling_device(logits.device), dtype=torch.float64)
    rows, vocab = z.shape
    tau = torch.ones(rows, dtype=torch.float64, device=z.device)
    tau[:n] = torch.tensor(list(temperatures), dtype=torch.float64)
    greedy = tau == 0.0
    tau = torch.where(greedy, torch.ones_like(tau), tau)
    noise = torch.ones((rows, vocab), dtype=torch.float64, device=z.device)
    noise[:n] = torch.from_numpy(np.asarray(exponentials, dtype=np.float64)).to(z.device)

    logp0_all = torch.log_softmax(z, dim=-1)
    logq_all = torch.log_softmax(z / tau[:, None], dim=-1)
    drawn = torch.argmax(torch.exp(logq_all) / noise, dim=-1)
    tokens = torch.where(greedy, torch.argmax(z, dim=-1), drawn)
    index = tokens[:, None]
    logp0 = logp0_all.gather(1, index)[:, 0]
    logq = torch.where(greedy, torch.zeros_like(logp0), logq_all.gather(1, index)[:, 0])
    entropy = None
    if want_entropy:
        p = torch.exp(logp0_all)
        entropy = -torch.where(p > 0, p * logp0_all, torch.zeros_like(p)).sum(dim=-1)[:n].cpu().numpy()
    return SampledRows(
        tokens[:n].cpu().numpy().astype(np.int64), logp0[:n].cpu().numpy(), logq[:n].cpu().numpy(), entropy
    )
