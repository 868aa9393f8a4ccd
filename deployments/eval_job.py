"""`presto-ray eval --ray`: each method's sampling as a resumable Ray Data job.

`RayDataEvalRunner` is the library's `EvalRunner` (presto_ray/eval_runner.py) on the batch job of
deployments/data_job.py. For each method it writes the method's work as a requests Parquet, one
row per (problem, sample[, candidate]), and runs it through an explicit-request stage
(actors/request_stage.py): power's rows through `ChainRequestStage`, each one chain of the job's
sampler with its `method_seed`; a plain method's rows (greedy, temperature_1, low_temperature,
best_of_n's candidates) through `GenerationRequestStage`, each one `ProposalRequest` at its
temperature and seed, sent through the coordinator like a chain's round.
The eval then reads the rows back, rebuilds the completions and chain results the in-process
runner returns, and grades them as it always does: the answers are the in-process answers.

The work folder (default: `--out` with the suffix `.work`) holds, per method:

    <work>/<method>/requests.parquet   what the method samples (rewritten by every run)
    <work>/<method>/rows/              the data job's output folder: Parquet files, .ray-checkpoint,
                                       .presto-ray-job.json (the sampler, engine and model)

A row's id is its key (`<problem id>/s<sample>[/c<candidate>]`) and a digest of its request (its
prompt's token ids, seed and temperature), so a rerun of the same command skips every row a
killed run committed (Ray Data's checkpoint) and samples only the rest; a row whose request
changed (another prompt template, --task-seed) gets a new id and is sampled again. A rerun with
another sampler config, engine or model is refused by the job record, before any work.

The engine replicas are started once and shared by the methods' jobs (each job has its own
coordinator, hence its own accounting); with `ray.replica_autoscaling` each job owns its pool.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from actors.cluster import SamplingCluster
from actors.request_stage import (
    REQUEST_SEED_COLUMN,
    REQUEST_TEMPERATURE_COLUMN,
    REQUEST_TOKENS_COLUMN,
    ChainRequestStage,
    GenerationRequestStage,
    RequestStage,
)
from actors.stage_base import BadPromptRow, JobFailed
from deployments.data_job import DataJobSummary, connect_ray, filesystem, run_data_job
from presto_ray.config import SamplerConfig
from presto_ray.engines import build_tokenizer
from presto_ray.engines.base import CallAccounting, Completion, ProposalRequest
from presto_ray.eval_runner import MethodRun
from presto_ray.job import JobConfig, content_digest
from presto_ray.results import SampleResult, SampleStats

__all__ = ["BadPromptRow", "JobFailed", "RayDataEvalRunner", "default_work_folder"]

if TYPE_CHECKING:
    from actors.engine_replica import ReplicaHandle

REQUESTS_FILE = "requests.parquet"
ROWS_FOLDER = "rows"
READ_COLUMNS = ["prompt_id", "error", "token_ids", "cached_prompt_tokens", "logp0", "logq", "finish_reason", "sample_stats",
                "started_at", "finished_at"]  # fmt: skip


def default_work_folder(out: str) -> str:
    """Where `eval --ray` keeps its rows: beside the report, `--out` with the suffix .work."""
    return str(Path(out).with_suffix(".work"))


class RayDataEvalRunner:
    """`EvalRunner` on the Ray Data job: one resumable job per method, in `work`."""

    def __init__(
        self,
        job: JobConfig,
        work: str,
        *,
        address: str | None = None,
        progress: bool = True,
        say: Callable[[str], None] | None = None,
        replicas: list[ReplicaHandle] | None = None,
    ) -> None:
        self.job = job.model_copy(update={"chains_per_prompt": 1})  # one chain or generation per row
        self.work, self.address, self.progress = work.rstrip("/"), address, progress
        self.say = say or (lambda _line: None)
        self.tokenizer = build_tokenizer(job.engine)
        self.context_length: int | None = job.engine.context_length
        self.summaries: dict[str, DataJobSummary] = {}
        self._replicas = replicas
        self._cluster: SamplingCluster | None = None  # holds the shared replicas, started at the first job
        self._job_started = 0.0

    # --- EvalRunner ----------------------------------------------------------------------------
    def generations(self, method: str, requests: Sequence[ProposalRequest], keys: Sequence[str]) -> MethodRun[Completion]:
        horizon = self.job.sampler.horizon
        for r in requests:  # the stage rebuilds each request from its prompt, seed and temperature
            if r.prefix_token_ids or r.max_new_tokens != horizon or not r.stop_at_eos or r.want_entropy or r.rejection_bounds:
                raise ValueError(f"{method}: the Ray job sends plain requests from the prompt up to the horizon only")
        temperatures = [float(r.temperature) for r in requests]
        ids, table = _request_rows(keys, [r.prompt_token_ids for r in requests], [r.seed for r in requests], temperatures)
        found, accounting, resumed = self._run(method, ids, table, GenerationRequestStage)
        completions = [
            Completion(tuple(row["token_ids"]), np.asarray(row["logp0"], dtype=np.float64),
                       np.asarray(row["logq"], dtype=np.float64), row["finish_reason"], row["cached_prompt_tokens"] or 0)
            for row in found
        ]  # fmt: skip
        return MethodRun(completions, accounting, resumed)

    def chains(
        self, method: str, prompts: Sequence[Sequence[int]], configs: Sequence[SamplerConfig], keys: Sequence[str]
    ) -> MethodRun[SampleResult]:
        sampler = self.job.sampler
        for c in configs:  # the stage runs the job's sampler with each row's seed
            if c.model_copy(update={"seed": sampler.seed}) != sampler:
                raise ValueError(f"{method}: the Ray job runs chains of the job's sampler config (only the seed may differ)")
        ids, table = _request_rows(keys, prompts, [c.seed for c in configs], None)
        found, accounting, resumed = self._run(method, ids, table, ChainRequestStage)
        results = [
            SampleResult(tuple(row["token_ids"]), SampleStats(**json.loads(row["sample_stats"])), tuple(row["logp0"]))
            for row in found
        ]
        if sampler.schedule == "streaming" and accounting.wall_time_s == 0.0:
            # streamed requests are no timed calls: as in process, the engine time is the stream's
            # span, here from the first chain this run started to the last one's end
            accounting.wall_time_s = self._span(found)
        return MethodRun(results, accounting, resumed)

    def start(self) -> None:
        """The shared engine replicas, before the first method is timed (after run_eval's checks)."""
        self._shared_replicas()

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None

    # --- one method's job ----------------------------------------------------------------------
    def _run(self, method: str, ids: list[str], table: pa.Table, stage: type[RequestStage]) -> tuple[list[dict[str, Any]], CallAccounting, int]:
        """Write the method's requests, run (or resume) its job, read its rows back in input order."""
        if len(set(ids)) != len(ids):
            raise ValueError(f"{method}: two rows with the same key and request")
        folder = f"{self.work}/{method}"
        requests, out = f"{folder}/{REQUESTS_FILE}", f"{folder}/{ROWS_FOLDER}"
        _write_atomic(table, requests)
        self._job_started = time.time()
        self.say(f"{method}: {len(ids)} rows through the Ray Data job in {out}")
        try:
            summary = run_data_job(
                requests, out, self.job, stage=stage, address=self.address, progress=self.progress,
                replicas=self._shared_replicas(),
            )  # fmt: skip
        except ValueError as e:  # the folder holds other settings' rows, another writer, ...
            raise ValueError(
                f"{e} (eval --ray keeps each method's rows in {self.work} to resume a rerun with the same settings: "
                f"give another --out or --work, or remove {self.work})"
            ) from None
        self.summaries[method] = summary
        resumed = max(0, len(ids) - summary.samples - summary.errors)
        self.say(f"{method}: {summary.samples} rows sampled, {resumed} resumed from an earlier run, "
                 f"{summary.wall_time_s:.1f} s")  # fmt: skip
        by_id = _read_rows(out, set(ids))
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise JobFailed(f"{method}: {len(missing)} row(s) missing from {out} after the job (first: {missing[0]!r}); rerun to resume")
        found = [by_id[i] for i in ids]
        if bad := next((row for row in found if row["error"] is not None), None):
            raise ValueError(f"{method}: {bad['error']}")
        accounting = replace(summary.engine)  # this job's coordinator: this method's calls only
        return found, accounting, resumed

    def _span(self, found: list[dict[str, Any]]) -> float:
        """First start to last end of the rows this run sampled (resumed rows started before it)."""
        mine = [row for row in found if row["started_at"] is not None and row["started_at"] >= self._job_started]
        return max(row["finished_at"] for row in mine) - min(row["started_at"] for row in mine) if mine else 0.0

    def _shared_replicas(self) -> list[ReplicaHandle] | None:
        """The engine replicas every method's job uses (started once); None with autoscaling, where
        each job starts and scales its own."""
        if self._replicas is not None:
            return self._replicas
        if self.job.ray.replica_autoscaling is not None:
            return None
        if self._cluster is None:
            connect_ray(self.address, self.progress)
            self._cluster = SamplingCluster(  # bounded as the jobs' own start is (NotPlaced: one line)
                self.job.engine, self.job.ray, address=self.address, placement_timeout_s=self.job.ray.missing_node_timeout_s
            )
        return self._cluster.replicas


def _request_rows(
    keys: Sequence[str], prompts: Sequence[Sequence[int]], seeds: Sequence[int], temperatures: Sequence[float] | None
) -> tuple[list[str], pa.Table]:
    """A method's rows for its request stage: ids, and the table of token ids, seeds and, for plain
    generations, temperatures (None: chains). A row's id is its key and a digest of its request
    (a chain's temperature is null in it, as in every work folder since eval --ray first ran)."""
    per_row = temperatures if temperatures is not None else [None] * len(keys)
    ids = [f"{key}@{content_digest([list(tokens), seed, t])[:16]}" for key, tokens, seed, t in zip(keys, prompts, seeds, per_row, strict=True)]
    columns = {
        "id": pa.array(ids, pa.string()),
        REQUEST_TOKENS_COLUMN: pa.array([list(tokens) for tokens in prompts], pa.list_(pa.int64())),
        REQUEST_SEED_COLUMN: pa.array(list(seeds), pa.int64()),
    }
    if temperatures is not None:
        columns[REQUEST_TEMPERATURE_COLUMN] = pa.array(list(temperatures), pa.float64())
    return ids, pa.table(columns)


def _write_atomic(table: pa.Table, uri: str) -> None:
    fs, path, _ = filesystem(uri)
    fs.create_dir(path.rpartition("/")[0], recursive=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with fs.open_output_stream(tmp) as f:
        pq.write_table(table, f)
    fs.move(tmp, path)  # atomic on local disks; object stores write whole objects anyway


def _read_rows(out: str, wanted: set[str]) -> dict[str, dict[str, Any]]:
    """The committed rows of the job's folder whose id is wanted (readers skip dot-files)."""
    fs, path, _ = filesystem(out)
    dataset = pads.dataset(path, filesystem=fs, format="parquet")
    by_id: dict[str, dict[str, Any]] = {}
    for batch in dataset.to_batches(columns=READ_COLUMNS):
        for row in batch.to_pylist():
            if row["prompt_id"] in wanted:
                by_id.setdefault(row["prompt_id"], row)
    return by_id
