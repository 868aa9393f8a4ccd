"""Engine specs: the `engine:` section of a job config, one pydantic model per engine kind.

A spec builds its engine and its tokenizer and answers what callers need before the engine runs
(model name, context length, GPUs per replica), so no caller asks which kind of engine it has.
Plain pydantic: importing this module needs neither vLLM nor Ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from presto_ray.engines.base import Engine, Tokenizer

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


class ToyEngineSpec(BaseModel):
    """The exact numpy toy model: enumerable probabilities, for exactness tests and fast runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["toy"] = "toy"
    vocab_size: int = Field(64, ge=2, le=100_000, description="Tokens in the vocabulary.")
    eos_token_id: int | None = Field(0, description="The EOS token, or None for a model without EOS.")
    seed: int = Field(1, description="Seed of the model's tables (not of sampling).")
    logit_scale: float = Field(4.0, gt=0.0, description="Multiplies every logit: 3-6 peaks the law like an LLM's.")
    eos_bias: float = Field(-3.0, description="Added to the EOS logit (negative: longer answers).")
    max_model_len: int = Field(4096, ge=16, description="Longest prompt + generation a request may ask for.")
    call_latency_s: float = Field(0.0, ge=0.0, description="Benchmarks: seconds each call sleeps (fixed cost).")
    token_latency_s: float = Field(
        0.0, ge=0.0, description="Benchmarks: seconds each call sleeps per generated token (streaming: per decode step)."
    )

    @property
    def model_name(self) -> str:
        return "toy"

    @property
    def context_length(self) -> int:
        return self.max_model_len

    @property
    def gpus_per_replica(self) -> int:
        return 0

    def build(self) -> "Engine":
        from presto_ray.engines.toy import ToyEngine

        return ToyEngine(
            self.vocab_size,
            self.eos_token_id,
            self.seed,
            logit_scale=self.logit_scale,
            eos_bias=self.eos_bias,
            max_model_len=self.max_model_len,
            call_latency_s=self.call_latency_s,
            token_latency_s=self.token_latency_s,
        )

    def build_tokenizer(self) -> "Tokenizer":
        from presto_ray.engines.toy import ToyTokenizer

        return ToyTokenizer(self.vocab_size, self.eos_token_id)

    def sample_identity(self) -> dict:
        """What the samples depend on (resume keys): the model's tables, not the latency model."""
        return self.model_dump(mode="json", exclude={"call_latency_s", "token_latency_s"})


class VLLMEngineConfig(BaseModel):
    """vLLM settings. Defaults are the CPU settings measured to matter (see ENGINE_NOTES.md)."""

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
    max_model_len: int = Field(2048, ge=16, description="Longest prompt + generation.")
    max_num_seqs: int = Field(64, ge=1, description="Most sequences vLLM decodes at once.")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one engine spans (device 'gpu').")
    speculation_batch: int | None = Field(
        None, ge=1,
        description="Streaming: sequences the engine runs before speculation stops paying, shared by the chains "
        "(presto_ray/speculation.py); None: max_num_seqs on GPUs, 30 on CPUs (where a step costs three lone steps, "
        "from the throughputs measured in ENGINE_NOTES.md).",
    )
    logp0_from: Literal["sampler", "scoring_pass"] = Field(
        "sampler",
        description="Where log p0 (and EntropyCut's entropies) come from. 'sampler': the generating pass returns "
        "them beside log q_tau (vLLM's sampler wrapped in its worker, presto_ray/engines/vllm_sampler_patch.py). "
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

    def build(self) -> "Engine":
        from presto_ray.engines.vllm_engine import VLLMEngine

        return VLLMEngine(self)

    def build_tokenizer(self) -> "Tokenizer":
        from presto_ray.engines.vllm_engine import load_tokenizer

        return load_tokenizer(self)

    def sample_identity(self) -> dict:
        """What the samples depend on (resume keys): the settings that change numbers, and the
        model folder's identity (its config and the names and sizes of its weight files), not
        memory, batch or thread settings."""
        from presto_ray.engines.vllm_engine import resolve_model_dir

        model_dir = Path(resolve_model_dir(self))
        weights = sorted((f.name, f.stat().st_size) for f in model_dir.iterdir() if f.suffix in (".safetensors", ".bin"))
        throughput_only = {"gpu_memory_utilization", "max_num_seqs", "speculation_batch", "cpu_threads_bind", "enforce_eager"}
        return {
            **self.model_dump(mode="json", exclude=throughput_only),
            "model_config": (model_dir / "config.json").read_text(),
            "model_weights": weights,
        }


EngineSpec = Annotated[Union[ToyEngineSpec, VLLMEngineConfig], Field(discriminator="kind")]


def build_engine(spec: ToyEngineSpec | VLLMEngineConfig) -> "Engine":
    """The engine a spec describes (its `.tokenizer` encodes prompts and decodes samples)."""
    return spec.build()


def build_tokenizer(spec: ToyEngineSpec | VLLMEngineConfig) -> "Tokenizer":
    """The tokenizer of the engine a spec describes, without starting the engine."""
    return spec.build_tokenizer()
