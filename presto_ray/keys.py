"""Keyed randomness (docs/algorithm.md, section 3).

Every random choice of a chain is a pure function of (chain seed, domain, index), never of call
order, so any schedule of model calls reproduces the serial chain exactly.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

_CUT, _ACCEPT, _PROPOSAL, _EXTENSION, _TRY, _SELECT = 0, 1, 2, 3, 4, 5
SEED_BOUND = 2**62  # engine seeds stay well inside int64


class StepKeys(NamedTuple):
    cut_uniform: float  # U_j: the cut, e.g. c_j = floor(U_j * |x|)
    accept_uniform: float  # V_j: accept iff log V_j < log r
    proposal_seed: int  # S_j: the proposal is a function of (S_j, prefix)
    selection_uniform: float  # MultiTryMH: picks try i with probability w_i / W


def _rng(seed: int, domain: int, *index: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, domain, *index]))


@lru_cache(maxsize=65536)
def step_keys(seed: int, step: int) -> StepKeys:
    """The keyed draws of global MH step `step`."""
    u = float(_rng(seed, _CUT, step).random())
    v = float(_rng(seed, _ACCEPT, step).random())
    s = int(_rng(seed, _PROPOSAL, step).integers(SEED_BOUND))
    w = float(_rng(seed, _SELECT, step).random())
    return StepKeys(u, v, s, w)


@lru_cache(maxsize=65536)
def try_seed(seed: int, step: int, index: int) -> int:
    """Seed of try `index` of step `step` (try 0 is the step's proposal seed)."""
    if index == 0:
        return step_keys(seed, step).proposal_seed
    return int(_rng(seed, _TRY, step, index).integers(SEED_BOUND))


@lru_cache(maxsize=4096)
def extension_seed(seed: int, block: int) -> int:
    """Seed of the extension that opens block `block`."""
    return int(_rng(seed, _EXTENSION, block).integers(SEED_BOUND))


def derive_seed(seed: int, *parts: int) -> int:
    """A chain seed derived from a job seed and e.g. (prompt index, chain index)."""
    return int(np.random.SeedSequence([seed, *parts]).generate_state(2, np.uint32).view(np.uint64)[0] % 2**63)
