"""The batch job on the in-process driver: prompts in, one row per (prompt, chain) out."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from presto_ray.config import SamplerConfig
from presto_ray.driver import sample_many
from presto_ray.engines.base import CallAccounting, Engine, Tokenizer
from presto_ray.engines.specs import EngineConfig, VLLMEngineConfig
from presto_ray.eval_config import EvalConfig
from presto_ray.keys import derive_seed
from presto_ray.output import sample_row
from presto_ray.prompts import PromptItem, context_problem
from presto_ray.results import SampleResult, SampleStats
from presto_ray.ray_config import RayConfig
from presto_ray.serve_config import ServeConfig


class JobConfig(BaseModel):
    """A job: which engine, how each chain samples, how many chains per prompt."""

    model_config = ConfigDict(extra="forbid")
    engine: EngineConfig = VLLMEngineConfig()
    sampler: SamplerConfig = SamplerConfig(block_size=48, mh_steps=10, prefetch_budget=8)
    chains_per_prompt: int = Field(2, ge=1, le=10_000, description="Independent chains per prompt.")
    max_active_chains: int = Field(64, ge=1, le=100_000, description="Chains whose requests share each call.")
    ray: RayConfig = Field(RayConfig(), description="Replicas, stage actors and batching for `sample --ray` and Serve.")
    serve: ServeConfig = Field(ServeConfig(), description="The HTTP service (`presto-ray serve`).")
    eval: EvalConfig = Field(EvalConfig(), description="`presto-ray eval`: prompt templates per task, best-of-n, samples.")

    @model_validator(mode="after")
    def _check_replica_gpus(self) -> "JobConfig":
        needed, reserved = self.engine.gpus_per_replica, self.ray.replica_num_gpus
        if reserved is not None and reserved < needed:
            raise ValueError(
                f"ray.replica_num_gpus ({reserved:g}) is below the {needed} GPUs one engine spans "
                "(engine.tensor_parallel_size); leave it unset to reserve exactly what the engine needs"
            )
        return self

    @classmethod
    def from_yaml(cls, path: str | Path) -> "JobConfig":
        """The config in a YAML file; a file that is not YAML is a ConfigFileError of one line."""
        text = Path(path).read_text()
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            raise ConfigFileError(f"{path}: not valid YAML: {yaml_error_text(e)}") from None
        return cls.model_validate(data)


class ConfigFileError(ValueError):
    """A job config file that cannot be read as a config; the message names the file."""


def yaml_error_text(error: yaml.YAMLError) -> str:
    """PyYAML's error in one line: what it found and where (its own text spans several lines,
    with a copy of the offending line)."""
    if isinstance(error, yaml.MarkedYAMLError):
        mark = error.problem_mark or error.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        what = "; ".join(part for part in (error.context, error.problem) if part)
        return f"{what or type(error).__name__}{where}"
    return str(error).splitlines()[0] if str(error).strip() else type(error).__name__


def prompt_seed(job_seed: int, prompt_id: str, chain: int) -> int:
    """A chain's seed depends on the prompt's id, not its position, so reruns are stable."""
    digest = int.from_bytes(hashlib.sha256(prompt_id.encode()).digest()[:8], "little")
    return derive_seed(job_seed, digest & 0xFFFFFFFF, digest >> 32, chain)


def engine_identity(spec: EngineConfig) -> str:
    """The engine and model as the samples see them, as canonical JSON (computed once per job)."""
    return json.dumps(spec.sample_identity(), sort_keys=True)


def content_digest(content: object) -> str:
    """The SHA-256 of `content` as canonical JSON (sorted keys): the resume keys' one hash."""
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def input_fingerprint(engine: str, sampler: SamplerConfig, item: PromptItem, prompt_ids: Sequence[int], chain: int) -> str:
    """A sample's resume key: a hash of everything it depends on (the prompt as written and as
    tokenized, the engine and model, the chain's sampler config with its seed, the chain index).
    A rerun whose inputs changed for a finished pair sees another key, never the stale sample."""
    content = {
        "prompt": item.prompt,
        "messages": list(item.messages) if item.messages is not None else None,
        "prompt_ids": list(prompt_ids),
        "engine": engine,
        "sampler": sampler.model_dump(mode="json"),
        "chain": chain,
    }
    return content_digest(content)


@dataclass
class JobSummary:
    """A job's figures: what its chains did (summed SampleStats) and what engine calls cost."""

    chains: SampleStats = field(default_factory=SampleStats)  # summed over this run's samples
    engine: CallAccounting = field(default_factory=CallAccounting)  # calls are shared by chains
    samples: int = 0
    skipped: int = 0  # pairs a resumed job found already written
    wall_time_s: float = 0.0
    rows: list[dict] = field(default_factory=list)

    def add_result(self, row: dict, result: SampleResult) -> None:
        self.rows.append(row)
        self.samples += 1
        self.chains.add(result.stats)

    def lines(self) -> list[str]:
        def ratio(a: float, b: float) -> float:
            return a / b if b else 0.0

        c, e = self.chains, self.engine
        calls = [
            f"model calls          {e.calls} (chain rounds {c.rounds})",
            f"transitions per call {ratio(c.transitions, e.calls):.2f} "
            f"(per chain round {c.transitions_per_round:.2f})",
            f"requests per call    {ratio(c.requests, e.calls):.2f}",
        ] if e.calls else [  # streaming makes no batched calls
            f"requests             {c.requests} streamed in {c.stream_batches} batches "
            f"({c.forked_requests} forked, {c.aborted_requests} aborted)",
        ]
        return [
            f"samples              {self.samples}",
            *calls,
            f"acceptance rate      {c.acceptance_rate:.3f}",
            f"cached-token share   {ratio(e.cached_prompt_tokens, e.prompt_tokens):.3f}",
            f"generated tokens     {e.generated_tokens}",
            f"stopped early        {c.early_stopped_requests} requests, {c.early_stop_tokens_left} tokens left unused "
            f"({c.early_rejected_steps} steps rejected from their first tokens)",
            f"wall time            {self.wall_time_s:.2f} s",
        ] + (
            [f"resumed              {self.skipped} finished pairs skipped"] if self.skipped else []
        )


def encode_prompt(tokenizer: Tokenizer, item: PromptItem) -> list[int]:
    if item.prompt is not None:
        return tokenizer.encode(item.prompt)
    assert item.messages is not None  # a PromptItem holds a prompt or messages
    return tokenizer.apply_chat_template(item.messages)


def run_job(
    items: list[PromptItem],
    config: JobConfig,
    engine: Engine,
    on_sample: Callable[[dict], None] | None = None,
    resumed: Sequence[dict] = (),
) -> JobSummary:
    """Sample every (prompt, chain) with `engine` (built by `build_engine(config.engine)`).

    All chains run together: each round, the requests of every active chain go in one call.
    `resumed`: rows a killed run finished (output.PartCheckpoint); a pair whose row has this run's
    `inputs` key is kept as it is (counted in `skipped`), not sampled again.
    """
    tokenizer = engine.tokenizer
    start = time.perf_counter()
    sampler_json = config.sampler.model_dump_json()
    work = [(item, chain) for item in items for chain in range(config.chains_per_prompt)]
    encoded = {item.id: encode_prompt(tokenizer, item) for item in items}
    context = getattr(engine, "context_length", None)
    for item in items:  # the HTTP service's rule, before any sampling
        if context is not None and (problem := context_problem(len(encoded[item.id]), config.sampler.horizon, context, "horizon")):
            raise ValueError(f"prompt id={item.id!r}: {problem}")
    seeds = [prompt_seed(config.sampler.seed, item.id, chain) for item, chain in work]
    configs = [config.sampler.model_copy(update={"seed": seed}) for seed in seeds]
    engine_key = engine_identity(config.engine)
    fingerprints = [
        input_fingerprint(engine_key, c, item, encoded[item.id], chain) for (item, chain), c in zip(work, configs)
    ]
    summary = JobSummary()
    rows: list[dict | None] = [None] * len(work)
    finished = {(r["prompt_id"], r["chain"]): r for r in resumed}
    for index, ((item, chain), key) in enumerate(zip(work, fingerprints)):
        if (row := finished.get((item.id, chain))) is not None and row.get("inputs") == key:
            rows[index] = row
    todo = [index for index, row in enumerate(rows) if row is None]
    summary.skipped = len(work) - len(todo)

    def on_result(position: int, result: SampleResult) -> None:
        index = todo[position]
        item, chain = work[index]
        rows[index] = row = sample_row(
            item.id, chain, seeds[index], result, tokenizer, sampler_json, fingerprints[index]
        )
        summary.add_result(row, result)
        if on_sample:
            on_sample(row)

    _, accounting = sample_many(
        engine,
        [encoded[work[index][0].id] for index in todo],
        [configs[index] for index in todo],
        max_active_chains=config.max_active_chains,
        on_result=on_result,
    )
    summary.engine = accounting
    summary.rows = [row for row in rows if row is not None]  # input order, not finishing order, resumed ones too
    summary.wall_time_s = time.perf_counter() - start
    return summary
