"""Engine specs: the `engine:` section of a job config, one pydantic model per engine kind.

A spec builds its engine and its tokenizer and answers what callers need before the engine runs
(model name, context length, GPUs per replica), so no caller asks which kind of engine it has.
Plain pydantic: importing this module needs neither vLLM nor Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from presto_ray.engines.transformers.config import TransformersEngineConfig
from presto_ray.engines.vllm.config import DEFAULT_MODEL_NAME, VLLMEngineConfig

if TYPE_CHECKING:
    from presto_ray.engines.base import Engine, Tokenizer

__all__ = [
    "DEFAULT_MODEL_NAME",
    "EngineConfig",
    "ToyEngineConfig",
    "TransformersEngineConfig",
    "VLLMEngineConfig",
    "build_engine",
    "build_tokenizer",
]


class ToyEngineConfig(BaseModel):
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
    speculation_batch: int | None = Field(
        None,
        ge=1,
        description="Sequences the chains share before speculation stops paying, as a loaded device's free batch "
        "(rounds' and streaming's budgets, presto_ray/speculation.py); None: unlimited, the toy's batch is free.",
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
            speculation_batch=self.speculation_batch,
        )

    def build_tokenizer(self) -> "Tokenizer":
        from presto_ray.engines.toy_tokenizer import ToyTokenizer

        return ToyTokenizer(self.vocab_size, self.eos_token_id)

    def sample_identity(self) -> dict[str, Any]:
        """What the samples depend on (resume keys): the model's tables, not the latency model."""
        return self.model_dump(mode="json", exclude={"call_latency_s", "token_latency_s"})


EngineConfig = Annotated[Union[ToyEngineConfig, VLLMEngineConfig, TransformersEngineConfig], Field(discriminator="kind")]
AnyEngineConfig = ToyEngineConfig | VLLMEngineConfig | TransformersEngineConfig


def build_engine(spec: AnyEngineConfig) -> "Engine":
    """The engine a spec describes (its `.tokenizer` encodes prompts and decodes samples)."""
    return spec.build()


def build_tokenizer(spec: AnyEngineConfig) -> "Tokenizer":
    """The tokenizer of the engine a spec describes, without starting the engine."""
    return spec.build_tokenizer()
