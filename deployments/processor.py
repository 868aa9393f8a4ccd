"""Power sampling as a Ray Data stage, in the idiom of Ray Data LLM's `build_processor`:

    from deployments.processor import build_power_sampling_processor

    with build_power_sampling_processor("configs/toy.yaml", concurrency=(1, 4)) as processor:
        processor(ray.data.read_parquet("s3://bucket/prompts")).write_parquet("s3://bucket/samples")

Input rows carry an id and a `prompt` or `messages` (column names configurable); each becomes
`chains_per_prompt` output rows with the sample columns of presto_ray/output.py, an `error` column
(null unless the prompt could not be sampled) and the input's other columns. The chains run in an
actor pool (`concurrency`: a size or an autoscaling (min, max) range) whose actors all share one
coordinator and its engine replicas, so requests merge into the same calls across the pool.
`stage=` runs another kind of row through the same pool (`presto-ray eval --ray`'s explicit
requests: actors/request_stage.py).

It lives above the library (which runs without Ray): deployments/data_job.py runs it as the
`presto-ray sample --ray` job. Ray is imported only when a processor is built or applied.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from presto_ray.data_columns import InputColumnsConfig
from presto_ray.job import JobConfig

if TYPE_CHECKING:
    import ray.data

    from actors.coordinator_stats import CoordinatorSnapshot
    from actors.engine_replica import ReplicaHandle
    from actors.stage_base import SamplingStage


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

    @classmethod
    def from_job(cls, job: JobConfig) -> "ProcessorConfig":
        """Defaults read off the job config: `ray.chain_actors` stage actors, and batches sized so
        that about `max_active_chains` chains run at once across the pool."""
        batches = job.ray.chain_actors * cls.model_fields["batches_per_actor"].default
        batch_size = max(1, job.max_active_chains // (job.chains_per_prompt * batches))
        return cls.model_validate({"job": job, "concurrency": job.ray.chain_actors, "batch_size": batch_size})


def processor_config(config: JobConfig | ProcessorConfig | str | Path, **fields: Any) -> ProcessorConfig:
    """The one reading of what a processor is given: a job config's YAML path is read, a job
    config gets the defaults read off it (`from_job`), and `fields` set ProcessorConfig fields
    (concurrency, batch_size, columns, fail_fast, ...), validated."""
    if isinstance(config, (str, Path)):
        config = JobConfig.from_yaml(config)
    if isinstance(config, JobConfig):
        config = ProcessorConfig.from_job(config)
    return ProcessorConfig.model_validate({**dict(config), **fields}) if fields else config


class PowerSamplingProcessor:
    """`processor(ds) -> ds`; owns the coordinator and engine replicas until `shutdown()`.
    `stage`: the stage class the rows go through (default `PowerSamplingStage`: prompt rows)."""

    def __init__(
        self,
        config: ProcessorConfig,
        *,
        stage: type[SamplingStage] | None = None,
        address: str | None = None,
        replicas: list[ReplicaHandle] | None = None,
    ) -> None:
        from actors.cluster import SamplingCluster
        from actors.sampling_stage import PowerSamplingStage

        self.config = config
        self.stage: type[SamplingStage] = stage or PowerSamplingStage
        self.stage.check_job(config.job)  # before anything starts
        # replicas or coordinators no node can hold end the job in one line (NotPlaced, a JobFailed)
        self.cluster = SamplingCluster(
            config.job.engine, config.job.ray, address=address, replicas=replicas,
            placement_timeout_s=config.job.ray.missing_node_timeout_s,
        )  # fmt: skip

    def __call__(self, ds: ray.data.Dataset) -> ray.data.Dataset:
        from ray.data import ActorPoolStrategy

        c = self.config
        if isinstance(c.concurrency, int):
            pool = ActorPoolStrategy(size=c.concurrency, max_concurrent_calls_per_actor=c.batches_per_actor)
        else:
            low, high = c.concurrency
            pool = ActorPoolStrategy(min_size=low, max_size=high, max_concurrent_calls_per_actor=c.batches_per_actor)
        return ds.map_batches(
            self.stage,
            batch_format="pyarrow",
            batch_size=c.batch_size,
            compute=pool,
            num_cpus=c.job.ray.chain_actor_num_cpus,
            resources=dict(c.job.ray.placement.chain_actor_resources) or None,  # the nodes that run the chains
            fn_constructor_kwargs=dict(
                coordinators=self.cluster.coordinators,
                config_json=c.job.model_dump_json(),
                columns=c.columns,
                fail_fast=c.fail_fast,
            ),
        )

    def snapshot(self, lost_ok: bool = False) -> CoordinatorSnapshot:
        """The coordinator's figures: engine calls, requests, replica failures (`lost_ok`: see
        `CoordinatorShards.snapshot_blocking`)."""
        return self.cluster.snapshot(lost_ok)

    def shutdown(self) -> None:
        self.cluster.shutdown()

    def __enter__(self) -> "PowerSamplingProcessor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def build_power_sampling_processor(
    config: JobConfig | ProcessorConfig | str | Path,
    *,
    stage: type[SamplingStage] | None = None,
    address: str | None = None,
    replicas: list[ReplicaHandle] | None = None,
    **fields: Any,
) -> PowerSamplingProcessor:
    """A processor for `config` (a job config, its YAML path, or a full ProcessorConfig); `fields`
    set ProcessorConfig fields (concurrency, batch_size, columns, fail_fast, ...), `stage` the
    kind of rows (default: prompts). Starts the engine replicas and the coordinator (or uses
    running `replicas`)."""
    return PowerSamplingProcessor(processor_config(config, **fields), stage=stage, address=address, replicas=replicas)
