"""Power sampling as a Ray Data stage, in the idiom of Ray Data LLM's `build_processor`:

    from deployments.processor import build_power_sampling_processor

    with build_power_sampling_processor("configs/toy.yaml", concurrency=(1, 4)) as processor:
        processor(ray.data.read_parquet("s3://bucket/prompts")).write_parquet("s3://bucket/samples")

Input rows carry an id and a `prompt` or `messages` (column names configurable); each becomes
`chains_per_prompt` output rows with the sample columns of presto_ray/output.py, an `error` column
(null unless the prompt could not be sampled) and the input's other columns. The chains run in an
actor pool (`concurrency`: a size or an autoscaling (min, max) range) whose actors all share one
coordinator and its engine replicas, so requests merge into the same calls across the pool.

It lives above the library (which runs without Ray): deployments/data_job.py runs it as the
`presto-ray sample --ray` job. Ray is imported only when a processor is built or applied.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from presto_ray.data_columns import InputColumnsConfig
from presto_ray.job import JobConfig

if TYPE_CHECKING:
    import ray.data

    from actors.coordinator_stats import CoordinatorSnapshot


class ProcessorConfig(BaseModel):
    """How the stage runs; the job config says what it samples."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    job: JobConfig
    columns: InputColumnsConfig = InputColumnsConfig()
    concurrency: int | tuple[int, int] = Field(
        1, description="Stage actors: a fixed count, or (min, max) for Ray Data to autoscale between."
    )
    batch_size: int = Field(8, ge=1, description="Prompts per batch; every chain of a batch runs at once.")
    batches_per_actor: int = Field(
        4, ge=1, le=1024, description="Batches each stage actor runs at once (their chains share its event loop)."
    )
    fail_fast: bool = Field(False, description="Stop the job at the first bad prompt instead of writing its error.")
    rows: Literal["prompts", "requests"] = Field(
        "prompts",
        description="What an input row is. `prompts`: an id and a prompt or messages, sampled by chains_per_prompt "
        "chains seeded from the job seed and the id. `requests` (what `presto-ray eval --ray` writes): one explicit "
        "piece of work per row, its prompt already tokenized (`request_token_ids`) with its own seed "
        "(`request_seed`) and `request_temperature`: null for one chain of the job's sampler, a number for one "
        "plain generation at that temperature up to the horizon; the output adds logp0, logq, finish_reason, "
        "sample_stats, started_at and finished_at (actors/sampling_stage.py). Needs chains_per_prompt 1.",
    )

    @model_validator(mode="after")
    def _one_chain_per_request(self) -> "ProcessorConfig":
        if self.rows == "requests" and self.job.chains_per_prompt != 1:
            raise ValueError("rows='requests' runs one chain or generation per row: chains_per_prompt must be 1")
        return self

    @classmethod
    def from_job(cls, job: JobConfig, **overrides: Any) -> "ProcessorConfig":
        """Defaults read off the job config: `ray.chain_actors` stage actors, and batches sized so
        that about `max_active_chains` chains run at once across the pool."""
        batches = job.ray.chain_actors * cls.model_fields["batches_per_actor"].default
        batch_size = max(1, job.max_active_chains // (job.chains_per_prompt * batches))
        return cls.model_validate({"job": job, "concurrency": job.ray.chain_actors, "batch_size": batch_size, **overrides})


class PowerSamplingProcessor:
    """`processor(ds) -> ds`; owns the coordinator and engine replicas until `shutdown()`."""

    def __init__(self, config: ProcessorConfig, *, address: str | None = None, replicas: list[Any] | None = None) -> None:
        from actors.cluster import SamplingCluster

        self.config = config
        self.cluster = SamplingCluster(config.job.engine, config.job.ray, address=address, replicas=replicas).start()

    def __call__(self, ds: ray.data.Dataset) -> ray.data.Dataset:
        from ray.data import ActorPoolStrategy

        from actors.sampling_stage import PowerSamplingStage

        c = self.config
        if isinstance(c.concurrency, int):
            pool = ActorPoolStrategy(size=c.concurrency, max_concurrent_calls_per_actor=c.batches_per_actor)
        else:
            low, high = c.concurrency
            pool = ActorPoolStrategy(min_size=low, max_size=high, max_concurrent_calls_per_actor=c.batches_per_actor)
        return ds.map_batches(
            PowerSamplingStage,
            batch_format="pyarrow",
            batch_size=c.batch_size,
            compute=pool,
            num_cpus=c.job.ray.chain_actor_num_cpus,
            fn_constructor_kwargs=dict(
                coordinators=self.cluster.coordinators,
                config_json=c.job.model_dump_json(),
                columns=c.columns,
                fail_fast=c.fail_fast,
                rows=c.rows,
            ),
        )

    def snapshot(self) -> CoordinatorSnapshot:
        """The coordinator's figures: engine calls, requests, replica failures."""
        return self.cluster.snapshot()

    def shutdown(self) -> None:
        self.cluster.shutdown()

    def __enter__(self) -> "PowerSamplingProcessor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def build_power_sampling_processor(
    config: JobConfig | ProcessorConfig | str | Path, *, address: str | None = None, replicas: list[Any] | None = None,
    **stage: Any,
) -> PowerSamplingProcessor:
    """A processor for `config` (a job config, its YAML path, or a full ProcessorConfig); `stage`
    sets ProcessorConfig fields (concurrency, batch_size, columns, fail_fast, ...). Starts the
    engine replicas and the coordinator (or uses running `replicas`)."""
    if isinstance(config, (str, Path)):
        config = JobConfig.from_yaml(config)
    if isinstance(config, JobConfig):
        config = ProcessorConfig.from_job(config, **stage)
    elif stage:
        config = ProcessorConfig.model_validate({**dict(config), **stage})
    return PowerSamplingProcessor(config, address=address, replicas=replicas)
