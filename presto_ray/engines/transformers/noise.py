"""Keyed sampling noise: for each (request seed, absolute position), one standard exponential per
vocabulary entry from Philox4x64-10 keyed by both, never from a shared generator's call order. A
proposal's token at a position is then a function of the request and the logits alone, whatever
the batch, its order or the schedule.

sampling.py draws the token as an exponential race, argmax_i q_tau(i) / E_i, which picks i with
probability q_tau(i) exactly (the Gumbel-max trick: -log E_i is Gumbel). A race is robust to the
logits' rounding: a token changes only where two candidates' q_i / E_i lie within the rounding of
each other, unlike inverting the CDF, where every one of the vocabulary's boundaries carries the
cumulative sum's rounding (measured: 1e-5 changes in the logits moved CDF-drawn tokens).

numpy only: the noise is drawn on the CPU, one row per sequence and step.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

_U64 = 2**64


def keyed_generator(seed: int, position: int) -> np.random.Generator:
    """The generator of (seed, position): Philox4x64-10 keyed by (seed mod 2^64, position)."""
    key = np.array([seed % _U64, position % _U64], dtype=np.uint64)
    return np.random.Generator(np.random.Philox(key=key))


def keyed_exponentials(seeds: Sequence[int], positions: Sequence[int], size: int) -> np.ndarray:
    """(len(seeds), size) float64 standard exponentials, row i keyed by (seeds[i], positions[i])."""
    out = np.empty((len(seeds), size), dtype=np.float64)
    for i, (seed, position) in enumerate(zip(seeds, positions)):
        keyed_generator(seed, position).standard_exponential(size, out=out[i])
    return out
