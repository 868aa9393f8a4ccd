"""The layout of the wrapped sampler's log-probabilities (sampler_patch.py), read in front.

Each sampled token's position in vLLM's `FlatLogprobs` holds SAMPLER_COLUMNS entries, all under
the sampled token's id: log q_tau (vLLM's own), log p0, and the entropy of p0. This module does
not import vLLM, so the front end can read them without patching anything.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

SAMPLER_COLUMNS = 3  # log q_tau, log p0, entropy: a request asks vLLM for SAMPLER_COLUMNS - 1 log-probabilities
LOGQ_COLUMN, LOGP0_COLUMN, ENTROPY_COLUMN = 0, 1, 2
# vLLM's `worker_extension_cls`: the class vLLM imports in each worker, which wraps its sampler
EXTENSION_QUALNAME = "presto_ray.engines.vllm.sampler_patch.PrestoWorkerExtension"


def sampler_columns(flat: Any, tokens: Sequence[int]) -> np.ndarray:
    """(len(tokens), SAMPLER_COLUMNS) from a request's flat log-probabilities (vLLM's `FlatLogprobs`
    or anything with its start_indices, end_indices, token_ids and logprobs); a clear error when
    vLLM's sampler was not wrapped (another vLLM whose sampler the patch does not reach)."""
    out = np.empty((len(tokens), SAMPLER_COLUMNS), dtype=np.float64)
    for i, token in enumerate(tokens):
        begin, end = flat.start_indices[i], flat.end_indices[i]
        ids = flat.token_ids[begin:end]
        if end - begin < SAMPLER_COLUMNS or any(t != token for t in ids[:SAMPLER_COLUMNS]):
            raise RuntimeError(
                "vLLM returned no log p0 beside the sampled tokens: its sampler was not wrapped "
                "(presto_ray/engines/vllm/sampler_patch.py reaches vLLM 0.32's v1 Sampler). "
                "Set the engine's logp0_from to 'scoring_pass' to score each completion with a second pass."
            )
        out[i] = flat.logprobs[begin : begin + SAMPLER_COLUMNS]
    return out
