"""Log p0 and the entropy of p0 from the generating pass, beside log q_tau (vLLM v1 sampler).

vLLM returns one kind of log-probability per engine (`logprobs_mode`). Power sampling needs two
for every sampled token: log q_tau (the law it was drawn from) and log p0 (the target), and
EntropyCut needs the entropy of p0 at each position. Without this module they come from a
second, scoring pass that prefills prompt + prefix + completion again and skips the prefix cache.

This module wraps `vllm.v1.sample.sampler.Sampler.forward` so that a request asking for
`SAMPLER_COLUMNS - 1` (or more) log-probabilities gets, for each sampled token x, in
`flat_logprobs` order (read back by sampler_columns.py):

- column 0: (x, log q_tau(x)), vLLM's own processed log-probability (unchanged);
- column 1: (x, log p0(x)), log_softmax of the logits before temperature;
- column 2: (x, H(p0)), the entropy of p0 at that position.

What is sampled is untouched: the wrapper reads the logits before vLLM's sampler scales them in
place and only overwrites two top-k columns of the returned log-probabilities. The PreSTO authors
patched vLLM's sampler for the same reason.

It reaches vLLM's worker process as `worker_extension_cls` (an engine argument that vLLM imports
in every worker): importing this module there applies the wrapper once. Only engines that name it
are affected.
"""

from __future__ import annotations

from typing import Any

from presto_ray.engines.vllm.sampler_columns import ENTROPY_COLUMN, LOGP0_COLUMN, SAMPLER_COLUMNS


def _patch_sampler() -> None:
    import torch
    from vllm.v1.sample.sampler import Sampler

    if getattr(Sampler.forward, "_presto_patched", False):
        return
    original = Sampler.forward

    def forward(self: Any, logits: Any, sampling_metadata: Any, *args: Any, **kwargs: Any) -> Any:
        # (self, logits, sampling_metadata, predict_bonus_token=False, logprobs_mode_override=None) in
        # vLLM 0.32; passed through as they come so that a changed signature still samples.
        mode = kwargs.get("logprobs_mode_override") or self.logprobs_mode
        wanted = (
            mode == "processed_logprobs"
            and sampling_metadata.max_num_logprobs is not None
            and sampling_metadata.max_num_logprobs >= SAMPLER_COLUMNS - 1
        )
        # vLLM divides the logits by the temperature in place: read log p0 first.
        logp0 = logits.log_softmax(dim=-1, dtype=torch.float32) if wanted else None
        output = original(self, logits, sampling_metadata, *args, **kwargs)
        tensors = output.logprobs_tensors
        if logp0 is None or tensors is None or tensors.logprobs.dim() != 2 or output.sampled_token_ids.shape[1] != 1:
            return output  # not asked for, or several tokens per step (speculative decoding): left as vLLM made it
        sampled = output.sampled_token_ids[:, 0].long()
        entropy = -torch.where(logp0 > float("-inf"), logp0.exp() * logp0, torch.zeros_like(logp0)).sum(dim=-1)
        tensors.logprob_token_ids[:, LOGP0_COLUMN] = sampled.to(tensors.logprob_token_ids.dtype)
        tensors.logprob_token_ids[:, ENTROPY_COLUMN] = sampled.to(tensors.logprob_token_ids.dtype)
        tensors.logprobs[:, LOGP0_COLUMN] = logp0.gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
        tensors.logprobs[:, ENTROPY_COLUMN] = entropy
        return output

    setattr(forward, "_presto_patched", True)  # a second import in the same worker leaves it alone
    setattr(Sampler, "forward", forward)


class PrestoWorkerExtension:
    """Named as vLLM's `worker_extension_cls`: vLLM imports it in each worker, which patches the
    sampler (this class adds no methods)."""


_patch_sampler()
