"""The batch job on the in-process driver: prompts in, one row per (prompt, chain) out."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Callable, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field

from presto_ray.config import SamplerConfig
from presto_ray.driver import sample_many
from presto_ray.engines.base import CallAccounting
from presto_ray.engines.toy import ToyEngine, ToyTokenizer
from presto_ray.engines.vllm_engine import VLLMEngineConfig
from presto_ray.keys import derive_seed
from presto_ray.prompts import PromptItem
from presto_ray.ray_config import RaySettings
from presto_ray.serve_config import ServeSettings


class ToyEngineSpec(BaseModel):
    """The exact numpy toy model (a real small LLM replaces it in the vLLM engine issue)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["toy"] = "toy"
    vocab_size: int = Field(64, ge=2, le=100_000)
    eos_token_id: int | None = 0
    seed: int = 1
    logit_scale: float = Field(4.0, gt=0.0)
    eos_bias: float = -3.0
    call_latency_s: float = Field(0.0, ge=0.0, description="Benchmarks: seconds each call sleeps (fixed cost).")
    token_latency_s: float = Field(0.0, ge=0.0, description="Benchmarks: seconds each call sleeps per generated token.")

    def build(self) -> ToyEngine:
        return ToyEngine(
            self.vocab_size,
            self.eos_token_id,
            self.seed,
            logit_scale=self.logit_scale,
            eos_bias=self.eos_bias,
            call_latency_s=self.call_latency_s,
            token_latency_s=self.token_latency_s,
        )


EngineSpec = Annotated[Union[ToyEngineSpec, VLLMEngineConfig], Field(discriminator="kind")]


def build_engine(spec: ToyEngineSpec | VLLMEngineConfig):
    """The engine a spec describes, with a `.tokenizer` (encode, apply_chat_template, decode)."""
    if isinstance(spec, ToyEngineSpec):
        return spec.build()
    from presto_ray.engines.vllm_engine import VLLMEngine

    return VLLMEngine(spec)


def build_tokenizer(spec: ToyEngineSpec | VLLMEngineConfig):
    """The tokenizer of the engine a spec describes, without building the engine."""
    if isinstance(spec, ToyEngineSpec):
        return ToyTokenizer(spec.vocab_size, spec.eos_token_id)
    from presto_ray.engines.vllm_engine import load_tokenizer

    return load_tokenizer(spec)


class JobConfig(BaseModel):
    """A job: which engine, how each chain samples, how many chains per prompt."""

    model_config = ConfigDict(extra="forbid")
    engine: EngineSpec = VLLMEngineConfig()
    sampler: SamplerConfig = SamplerConfig(block_size=48, mh_steps=10, prefetch_budget=8)
    chains_per_prompt: int = Field(2, ge=1, le=10_000, description="Independent chains per prompt.")
    max_active_chains: int = Field(64, ge=1, le=100_000, description="Chains whose requests share each call.")
    ray: RaySettings = Field(RaySettings(), description="Replicas, chain actors and batching for `sample --ray` and Serve.")
    serve: ServeSettings = Field(ServeSettings(), description="The HTTP service (`presto-ray serve`).")

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
    engine_calls: int = 0  # batched calls; the chains of a job share them
    chain_rounds: int = 0  # what serial-equivalent counting sees: one per chain per round
    transitions: int = 0
    accepted: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    scoring_tokens: int = 0
    wall_time_s: float = 0.0
    skipped: int = 0  # pairs a resumed job found already written
    replayed_chains: int = 0  # chains run again after their actor died (Ray jobs)
    resent_requests: int = 0  # requests sent again after their replica died (Ray jobs)
    rows: list[dict] = field(default_factory=list)

    def add_sample(self, row: dict, stats) -> None:
        self.rows.append(row)
        self.samples += 1
        self.chain_rounds += stats.model_calls
        self.transitions += stats.transitions
        self.accepted += stats.accepted
        self.requests += stats.requests

    def add_accounting(self, accounting) -> None:
        self.engine_calls = accounting.calls
        self.prompt_tokens = accounting.prompt_tokens
        self.cached_prompt_tokens = accounting.cached_prompt_tokens
        self.generated_tokens = accounting.generated_tokens
        self.scoring_tokens = accounting.scoring_tokens

    def add_coordinator(self, stats: dict) -> None:
        """The Ray coordinator's totals: calls are merged across chains, so count them there."""
        self.add_accounting(CallAccounting(**stats["accounting"]))
        self.resent_requests = stats["resent_requests"]

    def lines(self) -> list[str]:
        def ratio(a: float, b: float) -> float:
            return a / b if b else 0.0

        return [
            f"samples              {self.samples}",
            f"model calls          {self.engine_calls} (chain rounds {self.chain_rounds})",
            f"transitions per call {ratio(self.transitions, self.engine_calls):.2f} "
            f"(per chain round {ratio(self.transitions, self.chain_rounds):.2f})",
            f"requests per call    {ratio(self.requests, self.engine_calls):.2f}",
            f"acceptance rate      {ratio(self.accepted, self.transitions):.3f}",
            f"cached-token share   {ratio(self.cached_prompt_tokens, self.prompt_tokens):.3f}",
            f"generated tokens     {self.generated_tokens}",
            f"wall time            {self.wall_time_s:.2f} s",
        ] + (
            [f"resumed              {self.skipped} finished pairs skipped"] if self.skipped else []
        ) + (
            [f"recovered            {self.replayed_chains} chains replayed, {self.resent_requests} requests re-sent"]
            if self.replayed_chains or self.resent_requests
            else []
        )


def encode_prompt(tokenizer, item: PromptItem) -> list[int]:
    if item.prompt is not None:
        return tokenizer.encode(item.prompt)
    return tokenizer.apply_chat_template(item.messages)


def sample_row(prompt_id: str, chain: int, seed: int, result, tokenizer, eos_token_id, sampler_json: str) -> dict:
    """One output row (see output.SAMPLE_SCHEMA): the sample, its text and its statistics."""
    s = result.stats
    return {
        "prompt_id": prompt_id,
        "chain": chain,
        "seed": seed,
        "text": tokenizer.decode(result.token_ids),
        "token_ids": list(result.token_ids),
        "finished_with_eos": bool(result.token_ids) and result.token_ids[-1] == eos_token_id,
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


def run_job(
    items: list[PromptItem], config: JobConfig, engine, on_sample: Callable[[dict], None] | None = None
) -> JobSummary:
    """Sample every (prompt, chain) with `engine` (built by `build_engine(config.engine)`).

    All chains run together: each round, the requests of every active chain go in one call.
    """
    tokenizer = engine.tokenizer
    start = time.perf_counter()
    sampler_json = config.sampler.model_dump_json()
    work = [(item, chain) for item in items for chain in range(config.chains_per_prompt)]
    encoded = {item.id: encode_prompt(tokenizer, item) for item in items}
    seeds = [prompt_seed(config.sampler.seed, item.id, chain) for item, chain in work]
    summary = JobSummary()
    rows: list[dict | None] = [None] * len(work)

    def on_result(index: int, result) -> None:
        item, chain = work[index]
        rows[index] = row = sample_row(item.id, chain, seeds[index], result, tokenizer, engine.eos_token_id, sampler_json)
        summary.add_sample(row, result.stats)
        if on_sample:
            on_sample(row)

    _, accounting = sample_many(
        engine,
        [encoded[item.id] for item, _ in work],
        [config.sampler.model_copy(update={"seed": seed}) for seed in seeds],
        max_active_chains=config.max_active_chains,
        on_result=on_result,
    )
    summary.add_accounting(accounting)
    summary.rows = [row for row in rows if row is not None]  # input order, not finishing order
    summary.wall_time_s = time.perf_counter() - start
    return summary
