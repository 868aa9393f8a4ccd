"""What every sampling stage of a Ray Data job shares: a callable class for `Dataset.map_batches`
whose actors run their rows' chains and generations as coroutines through the cluster's
coordinators, and the failures that end a job.

The stages (one per kind of input row): `PowerSamplingStage` (actors/sampling_stage.py: prompt
rows, `chains_per_prompt` chains each) and the explicit-request stages of `presto-ray eval --ray`
(actors/request_stage.py: one chain or one plain generation per row). Each is constructed with the
same arguments, so the processor (deployments/processor.py) runs any of them.

A chain lost with the coordinator (Ray restarts it) is replayed from its keys, a plain request is
sent again (a completion is a function of its request); a stage actor that dies is restarted by
Ray Data and its batch re-run, which replays the same samples too.

Failures: `JobFailed` (the job cannot go on) and `BadPromptRow` (a bad row under `fail_fast`) are
Ray `UserCodeException`s. With `DataContext.raise_original_map_exception` on (the data job sets it,
deployments/data_job.py) Ray Data raises them unwrapped, so the driver's `RayTaskError.cause` is
the stage's own exception; as user-code exceptions they keep Ray Data's user-error log lines. Any
other exception of a stage is wrapped as Ray Data wraps a UDF's, so it surfaces as before.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

import pyarrow as pa
from ray.exceptions import GetTimeoutError, RayActorError, UserCodeException

from actors.chain_driver import drive_chain, generate
from actors.coordinator_commands import REPLICAS_LOST
from actors.coordinator_shards import CoordinatorShards
from actors.stream_protocol import StreamLost
from presto_ray.chain import Chain
from presto_ray.data_columns import INPUT_KEY_COLUMN, InputColumnsConfig
from presto_ray.engines import build_tokenizer
from presto_ray.engines.base import Completion, ProposalRequest
from presto_ray.job import JobConfig, engine_identity
from presto_ray.results import SampleResult

if TYPE_CHECKING:
    from actors.coordinator import CoordinatorHandle

# A chain replayed this many times is failing for a reason a restart does not fix.
MAX_CHAIN_ATTEMPTS = 5


class StageFailure(UserCodeException):
    """A failure of a stage that ends the job, delivered to the driver as itself (see the module's
    docstring). Its message is one line for the user; the cause stays chained in the stage's log."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message  # pickled with the exception: Ray Data appends its retry note to args

    def __str__(self) -> str:
        return self.message


class JobFailed(StageFailure, RuntimeError):
    """The job cannot go on (its coordinator is gone for good, a chain keeps failing)."""


class BadPromptRow(StageFailure, ValueError):
    """A bad prompt row under `fail_fast`: the message names the row and the field."""


class SamplingStage(ABC):
    """One stage actor: `await stage(batch)` turns a batch of input rows into output rows.

    A stage class also says what its job's folder records about its rows (`JOB_RECORD`, checked on
    every rerun, deployments/data_job.py) and which job configs it can run (`check_job`)."""

    JOB_RECORD: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def check_job(cls, job: JobConfig) -> None:
        """Refuse, before anything starts, a job config this stage cannot run."""

    def __init__(self, coordinators: CoordinatorShards, config_json: str, columns: InputColumnsConfig, fail_fast: bool) -> None:
        self.coordinators = coordinators  # a prompt's chains go to its shard
        self.config = JobConfig.model_validate_json(config_json)
        self.columns, self.fail_fast = columns, fail_fast
        self.tokenizer = build_tokenizer(self.config.engine)
        self.engine_key = engine_identity(self.config.engine)
        self.sampler_json = self.config.sampler.model_dump_json()
        self.context = self.config.engine.context_length

    async def __call__(self, batch: pa.Table) -> pa.Table:
        try:
            return await self.sample(batch)
        except StageFailure:
            raise
        except Exception as e:  # as Ray Data wraps a UDF's exception (ours it raises as they are)
            raise UserCodeException("UDF failed to process a data block.") from e

    @abstractmethod
    async def sample(self, batch: pa.Table) -> pa.Table:
        """The output rows of a batch of input rows."""

    def _bad(self, message: str) -> str:
        """A bad row's message for its error column; under `fail_fast`, the end of the job."""
        if self.fail_fast:
            raise BadPromptRow(message)
        return message

    def _with_inputs(
        self, out: pa.Table, batch: pa.Table, keys: Sequence[str], sources: Sequence[int], dropped: Sequence[str]
    ) -> pa.Table:
        """The output rows with their input's key and the input's other columns (`sources[k]`:
        the input row of output row k)."""
        out = out.append_column(INPUT_KEY_COLUMN, pa.array([keys[i] for i in sources], pa.string()))
        passthrough = batch.drop_columns([c for c in dropped if c in batch.column_names])
        if clashes := set(passthrough.column_names) & {*out.column_names}:
            raise ValueError(f"input columns {sorted(clashes)} have output columns' names; rename them")
        passthrough = passthrough.take(pa.array(sources, pa.int64()))
        for name in passthrough.column_names:
            out = out.append_column(passthrough.schema.field(name), passthrough.column(name))
        return out

    async def _register(self, starting: Sequence[tuple[Sequence[int], Hashable]]) -> None:
        """Tell the coordinators which chains start now, so their first plans merge into one call.
        Only an optimization: with the coordinator restarting, the chains join as they plan."""
        try:
            await self.coordinators.register_chains(starting)
        except RayActorError:
            pass

    async def _drive(self, coordinator: CoordinatorHandle, chain_id: tuple[str, int], make_chain: Callable[[], Chain]) -> SampleResult:
        """One chain to the end; when the coordinator dies (Ray restarts it) the chain is replayed
        from its keys, a fresh `make_chain()` each attempt."""
        for attempt in range(1, MAX_CHAIN_ATTEMPTS + 1):
            try:
                return await drive_chain(coordinator, chain_id, make_chain())
            except Exception as e:
                if REPLICAS_LOST in str(e) and not isinstance(e, (RayActorError, StreamLost)):
                    raise JobFailed(
                        f"chain {chain_id[0]}#{chain_id[1]}: a request gave up after {self.config.ray.max_call_attempts} lost "
                        "engine replica(s) (ray.max_call_attempts; their nodes or processes died); finished samples are "
                        "written, rerun to resume"
                    ) from e
                if not isinstance(e, (RayActorError, StreamLost)):
                    raise
                if attempt == MAX_CHAIN_ATTEMPTS:
                    raise JobFailed(
                        f"chain {chain_id[0]}#{chain_id[1]} failed {MAX_CHAIN_ATTEMPTS} times as the coordinator died; "
                        "finished samples are written, rerun to resume"
                    ) from e
                await self._wait_for_coordinator(coordinator)
        raise AssertionError("unreachable")

    async def _generate(self, coordinator: CoordinatorHandle, requests: list[ProposalRequest]) -> list[Completion]:
        """Plain requests in one submit, as one chain's round (`chain_driver.generate`);
        sent again if the coordinator restarts (a completion is a function of its request)."""
        for attempt in range(1, MAX_CHAIN_ATTEMPTS + 1):
            try:
                return await generate(coordinator, requests)
            except RayActorError as e:
                if attempt == MAX_CHAIN_ATTEMPTS:
                    raise JobFailed(
                        f"{len(requests)} plain generations failed {MAX_CHAIN_ATTEMPTS} times as the coordinator died; "
                        "finished rows are written, rerun to resume"
                    ) from e
                await self._wait_for_coordinator(coordinator)
        raise AssertionError("unreachable")

    async def _wait_for_coordinator(self, coordinator: CoordinatorHandle) -> None:
        """Until a restarting coordinator answers; one gone for good (out of restarts, its node
        lost) fails the job after `ray.coordinator_restart_timeout_s`."""
        timeout_s = self.config.ray.coordinator_restart_timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                await asyncio.wait_for(coordinator.snapshot.remote(), timeout=10)
                return
            except (RayActorError, GetTimeoutError, asyncio.TimeoutError) as e:
                if time.monotonic() > deadline:
                    raise JobFailed(
                        f"the coordinator died and did not come back within {timeout_s:g} s (ray.coordinator_max_restarts "
                        f"= {self.config.ray.coordinator_max_restarts} used up, or its node is gone); finished samples are "
                        "written, rerun to resume"
                    ) from e
                await asyncio.sleep(0.2)
