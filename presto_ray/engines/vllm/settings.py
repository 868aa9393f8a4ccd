"""The vLLM engine's settings: what the runtime, the codec and the tokenizer read.

The job config's `engine:` section (`kind: vllm`) is `VLLMEngineConfig` (config.py), these
settings plus what builds the engine; this module imports nothing of the engine, so every part
of it may read the settings. Plain pydantic: importing it needs neither vLLM nor torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


class VLLMEngineConfigBase(BaseModel):
    """vLLM settings. Defaults are the CPU settings measured to matter (2 CPU cores, SmolLM2-135M)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["vllm"] = "vllm"
    model: str | None = Field(None, description="Local HF model folder; None: the packaged SmolLM2-135M-Instruct.")
    device: Literal["cpu", "gpu"] = Field(
        "cpu", description="Where vLLM runs: 'gpu' makes each Ray replica reserve tensor_parallel_size GPUs."
    )
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field("float32", description="Weights and activations.")
    enforce_eager: bool = Field(True, description="Skip torch.compile: ~20 s start-up instead of ~120 s on CPU.")
    kv_block_size: int = Field(
        32, ge=1, description="Tokens per KV-cache block: the prefix cache reuses full blocks only."
    )
    gpu_memory_utilization: float = Field(0.3, gt=0.0, le=1.0, description="Share of (NUMA-node) memory for vLLM.")
    kv_cache_gib: float | None = Field(
        None, gt=0.0,
        description="The KV cache's size in GiB (vLLM's kv_cache_memory_bytes), the same on every machine; None: "
        "gpu_memory_utilization's share of the memory less the engine's own (on CPUs that share is of the NUMA "
        "node, so the cache, and the seconds its allocation takes at start-up, follow the machine).",
    )
    max_model_len: int = Field(2048, ge=16, description="Longest prompt + generation.")
    max_num_seqs: int = Field(64, ge=1, description="Most sequences vLLM decodes at once.")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one engine spans (device 'gpu').")
    speculation_batch: int | None = Field(
        None, ge=1,
        description="Sequences the engine runs before speculation stops paying, shared by the chains in rounds' and "
        "streaming's budgets (presto_ray/speculation.py); None: max_num_seqs on GPUs, 30 on CPUs (where a step costs three lone steps, "
        "from vLLM's throughputs measured on two CPU cores).",
    )
    logp0_from: Literal["sampler", "scoring_pass"] = Field(
        "sampler",
        description="Where log p0 (and EntropyCut's entropies) come from. 'sampler': the generating pass returns "
        "them beside log q_tau (vLLM's sampler wrapped in its worker, presto_ray/engines/vllm/sampler_patch.py). "
        "'scoring_pass': a second request prefills each completion again to score it (vLLM unmodified; slower).",
    )
    seed: int = Field(0, description="Engine seed (requests carry their own seeds).")
    cpu_threads_bind: str | None = Field(
        "all", description="VLLM_CPU_OMP_THREADS_BIND on CPUs: 'all' binds every core to the worker; None leaves vLLM's default."
    )
    chat_template_for_prompts: bool = Field(
        True, description="Wrap plain-text prompts as one user message when the model has a chat template."
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed_block_size(cls, data: Any) -> Any:
        if isinstance(data, dict) and "block_size" in data:
            raise ValueError(
                "engine.block_size was renamed kv_block_size (tokens per KV-cache block); "
                "sampler.block_size is the MH block"
            )
        return data

    @property
    def model_name(self) -> str:
        return Path(self.model).name if self.model else DEFAULT_MODEL_NAME

    @property
    def context_length(self) -> int:
        # the scoring pass prefills prompt + prefix + completion and asks vLLM for one more token
        return self.max_model_len - 1 if self.logp0_from == "scoring_pass" else self.max_model_len

    @property
    def gpus_per_replica(self) -> int:
        return self.tensor_parallel_size if self.device == "gpu" else 0

    @property
    def free_batch(self) -> int:
        if self.speculation_batch is not None:
            return self.speculation_batch
        return self.max_num_seqs if self.device == "gpu" else min(30, self.max_num_seqs)
