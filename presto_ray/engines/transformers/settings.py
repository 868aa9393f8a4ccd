"""The transformers engine's settings: what the model loader, the runner and the tokenizer read.

The job config's `engine:` section (`kind: transformers`) is `TransformersEngineConfig` (config.py),
these settings plus what builds the engine; this module imports nothing of the engine, so every
part of it may read the settings. Plain pydantic: importing it needs neither torch nor
transformers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from presto_ray.engines.vllm.settings import DEFAULT_MODEL_NAME

Device = Literal["auto", "cuda", "mps", "cpu"]


class TransformersEngineConfigBase(BaseModel):
    """A transformers causal LM decoded by presto-ray's own continuous batcher: exact log p0 and
    log q_tau from the generating pass, keyed sampling noise, a prefix cache, early rejection."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["transformers"] = "transformers"
    model: str | None = Field(None, description="Local HF model folder; None: the packaged SmolLM2-135M-Instruct.")
    device: Device = Field("auto", description="Torch device: 'auto' picks cuda, then mps, then cpu.")
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        "float32", description="Weights and activations ('auto': the model folder's own dtype). Log-probabilities "
        "are always computed in float64 from the logits."
    )
    max_model_len: int = Field(2048, ge=16, description="Longest prompt + prefix + generation a request may reach.")
    max_batch_size: int = Field(
        32, ge=1, description="Sequences decoded together (continuous batching: a waiting request takes the slot "
        "of one that ends)."
    )
    max_step_tokens: int = Field(
        1024, ge=1, description="Context tokens prefilled per step, beside the decoding rows: new requests wait for "
        "the next step past this (a longer context is still prefilled, alone)."
    )
    prefix_cache_tokens: int = Field(
        8192, ge=0, description="Tokens of KV kept for reuse, keyed by token ids (SmolLM2 in float32: 46 KiB a "
        "token); 0 turns the cache off. Running requests' KV is reused too (forks)."
    )
    batch_invariant: bool | None = Field(
        None, description="Compute every sequence so that its floats do not depend on the other sequences of the "
        "batch: per-sequence attention over its own keys, and matrix products with row counts the CPU's BLAS "
        "serves with one kernel (tokens and log-probabilities bit-identical alone and in any batch, as measured "
        "on CPU with MKL). Costs up to ~2x for a lone sequence's decode step. None: on for cpu, off elsewhere "
        "(GPU kernels are not batch-invariant this way: tokens may then differ in near-ties only)."
    )
    num_threads: int | None = Field(
        None, ge=1, description="torch.set_num_threads on cpu (None: torch's default, one per core)."
    )
    speculation_batch: int | None = Field(
        None, ge=1, description="Streaming: sequences the engine runs before speculation stops paying, shared by the "
        "chains (presto_ray/speculation.py); None: max_batch_size."
    )
    chat_template_for_prompts: bool = Field(
        True, description="Wrap plain-text prompts as one user message when the model has a chat template."
    )

    @property
    def model_name(self) -> str:
        return Path(self.model).name if self.model else DEFAULT_MODEL_NAME

    @property
    def context_length(self) -> int:
        return self.max_model_len

    @property
    def gpus_per_replica(self) -> int:
        return 1 if self.device == "cuda" else 0

    @property
    def free_batch(self) -> int:
        return self.speculation_batch if self.speculation_batch is not None else self.max_batch_size
