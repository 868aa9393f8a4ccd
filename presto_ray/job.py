"""The batch job on the in-process driver: prompts in, one row per (prompt, chain) out."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from presto_ray.config import SamplerConfig
from presto_ray.driver import sample
from presto_ray.engines.toy import ToyEngine, ToyTokenizer
from presto_ray.keys import derive_seed
from presto_ray.prompts import PromptItem


class ToyEngineSpec(BaseModel):
    """The exact numpy toy model (a real small LLM replaces it in the vLLM engine issue)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["toy"] = "toy"
    vocab_size: int = Field(64, ge=2, le=100_000)
    eos_token_id: int | None = 0
    seed: int = 1
    logit_scale: float = Field(4.0, gt=0.0)
    eos_bias: float = -3.0

    def build(self) -> tuple[ToyEngine, ToyTokenizer]:
        engine = ToyEngine(
            self.vocab_size, self.eos_token_id, self.seed, logit_scale=self.logit_scale, eos_bias=self.eos_bias
        )
        return engine, ToyTokenizer(self.vocab_size, self.eos_token_id)


class JobConfig(BaseModel):
    """A job: which engine, how each chain samples, how many chains per prompt."""

    model_config = ConfigDict(extra="forbid")
    engine: ToyEngineSpec = ToyEngineSpec()
    sampler: SamplerConfig = SamplerConfig()
    chains_per_prompt: int = Field(2, ge=1, le=10_000)

    @classmethod
    def from_yaml(cls, path: str | Path) -> "JobConfig":
        data = yaml.safe_load(Path(path).read_text()) or {}
        return cls.model_validate(data)


def prompt_seed(job_seed: int, prompt_id: str, chain: int) -> int:
    """A chain's seed depends on the prompt's id, not its position, so reruns are stable."""
    digest = int.from_bytes(hashlib.sha256(prompt_id.encode()).digest()[:8], "little")
    return derive_seed(job_seed, digest & 0xFFFFFFFF, digest >> 32, chain)


@dataclass
class JobSummary:
    samples: int = 0
    model_calls: int = 0
    transitions: int = 0
    accepted: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    wall_time_s: float = 0.0
    rows: list[dict] = field(default_factory=list)

    def lines(self) -> list[str]:
        per_call = self.transitions / self.model_calls if self.model_calls else 0.0
        acceptance = self.accepted / self.transitions if self.transitions else 0.0
        cached = self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        return [
            f"samples              {self.samples}",
            f"model calls          {self.model_calls}",
            f"transitions per call {per_call:.2f}",
            f"requests per call    {self.requests / max(self.model_calls, 1):.2f}",
            f"acceptance rate      {acceptance:.3f}",
            f"cached-token share   {cached:.3f}",
            f"wall time            {self.wall_time_s:.2f} s",
        ]


def run_job(
    items: list[PromptItem], config: JobConfig, on_sample: Callable[[dict], None] | None = None
) -> JobSummary:
    engine, tokenizer = config.engine.build()
    summary = JobSummary()
    start = time.perf_counter()
    sampler_json = config.sampler.model_dump_json()
    for item in items:
        prompt_ids = tokenizer.encode(item.prompt) if item.prompt is not None else tokenizer.apply_chat_template(item.messages)
        for chain in range(config.chains_per_prompt):
            seed = prompt_seed(config.sampler.seed, item.id, chain)
            result = sample(engine, prompt_ids, config.sampler.model_copy(update={"seed": seed}))
            s = result.stats
            row = {
                "prompt_id": item.id,
                "chain": chain,
                "seed": seed,
                "text": tokenizer.decode(result.token_ids),
                "token_ids": list(result.token_ids),
                "finished_with_eos": bool(result.token_ids) and result.token_ids[-1] == engine.eos_token_id,
                "model_calls": s.model_calls,
                "transitions": s.transitions,
                "accepted": s.accepted,
                "requests": s.requests,
                "generated_tokens": s.generated_tokens,
                "prompt_tokens": s.prompt_tokens,
                "cached_prompt_tokens": s.cached_prompt_tokens,
                "wall_time_s": s.wall_time_s,
                "config": sampler_json,
            }
            summary.rows.append(row)
            summary.samples += 1
            summary.model_calls += s.model_calls
            summary.transitions += s.transitions
            summary.accepted += s.accepted
            summary.requests += s.requests
            summary.prompt_tokens += s.prompt_tokens
            summary.cached_prompt_tokens += s.cached_prompt_tokens
            if on_sample:
                on_sample(row)
    summary.wall_time_s = time.perf_counter() - start
    return summary
