"""The batch job on Ray Data: read prompts -> the power-sampling stage -> write Parquet, resumable.

    presto-ray sample --ray --config configs/local.yaml --prompts prompts.jsonl --out out/samples
    ray job submit --working-dir . -- presto-ray sample --ray --prompts s3://bucket/p.parquet --out s3://bucket/run1

`presto-ray eval --ray` runs the same job over rows of explicit requests, through another stage
(`stage=`, actors/request_stage.py; deployments/eval_job.py).

Reading, the actor pool, backpressure, progress and writing are Ray Data's; the input is never
loaded into the driver. Resume is Ray Data's checkpointing (ray.data.checkpoint, Ray >= 2.5x),
keyed by each row's `input_key` (its id and a digest of its prompt fields): a write commits a file
and the keys it holds together (two-phase:
a pending checkpoint, the data file, the commit; a file left by a killed job beside a pending
checkpoint is deleted on the next run), and the next run's read drops rows whose key is committed
and marks a row whose id was committed with other prompt fields, which the stage turns into an
error row (deployments/checkpoint_filter.py).
All chains of a prompt come out of one batch, hence one block and one file, so "this prompt's key
is committed" means "each of its (prompt, chain) rows is written once". Two guarantees Ray's
checkpoint does not give are kept here: one live writer per output folder (`OutputLock`: local
paths and shared volumes only; object storage has no exclusive create, so a URI output takes no
lock and one job per output URI is the user's to ensure, docs/ray.md), and a
refusal to resume a folder written with another sampler config, engine, model or chain count
(`.presto-ray-job.json`).
"""

from __future__ import annotations

import gc
import io
import json
import logging
import socket
import time
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import ray.data
from ray.data.checkpoint import CheckpointConfig
from ray.exceptions import RayTaskError

from actors.cluster import ensure_ray
from actors.sampling_stage import PowerSamplingStage
from actors.stage_base import BadPromptRow, JobFailed, SamplingStage, StageFailure
from deployments.checkpoint_filter import content_checkpoint_filter
from deployments.processor import ProcessorConfig, build_power_sampling_processor, processor_config
from presto_ray.data_columns import ERROR_COLUMN, INPUT_KEY_COLUMN, InputColumnsConfig, input_key, key_id
from presto_ray.engines.base import CallAccounting
from presto_ray.job import JobConfig, engine_identity
from presto_ray.output import OutputLock, check_output_folder
from presto_ray.prompts import PromptFileError, check_ids, parse_jsonl_lines

CHECKPOINT_DIR = ".ray-checkpoint"  # inside the output folder; readers skip dot-folders
JOB_RECORD = ".presto-ray-job.json"
__all__ = [
    "BadPromptRow", "DataJobSummary", "JobFailed", "commit_sized", "connect_ray", "filesystem", "processor_config", "run_data_job",
]  # fmt: skip

if TYPE_CHECKING:
    from actors.engine_replica import ReplicaHandle


@dataclass
class DataJobSummary:
    samples: int = 0  # rows written by this run with a sample
    errors: int = 0  # rows written by this run with an error
    skipped: int = 0  # rows a previous run had written
    engine: CallAccounting = field(default_factory=CallAccounting)
    resent_requests: int = 0
    streamed_requests: int = 0
    early_stopped_requests: int = 0  # summed over the rows this run wrote (SampleStats)
    early_stop_tokens_left: int = 0
    wall_time_s: float = 0.0
    new_files: list[str] = field(default_factory=list)

    @property
    def rows_per_s(self) -> float:
        return (self.samples + self.errors) / self.wall_time_s if self.wall_time_s else 0.0

    def lines(self) -> list[str]:
        return [
            f"samples              {self.samples}",
            f"errors               {self.errors}",
            f"engine calls         {self.engine.calls} (streamed requests {self.streamed_requests})",
            f"generated tokens     {self.engine.generated_tokens}",
            f"stopped early        {self.early_stopped_requests} requests, {self.early_stop_tokens_left} tokens left unused",
            f"wall time            {self.wall_time_s:.2f} s ({self.rows_per_s:.1f} rows/s)",
        ] + ([f"resumed              {self.skipped} finished pairs skipped"] if self.skipped else [])


def filesystem(uri: str) -> tuple[pafs.FileSystem, str, bool]:
    """(filesystem, path in it, is local) for a local path or any URI pyarrow accepts."""
    if "://" not in uri:
        path = str(Path(uri).resolve())
        return pafs.LocalFileSystem(), path, True
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path, isinstance(fs, pafs.LocalFileSystem)


class PromptInput(ABC):
    """The prompt file or folder of a job, by its kind: JSONL (`.jsonl`, `.json`) or Parquet (a
    `.parquet` file or a folder). `prompt_input` is the one place that tells them apart."""

    def __init__(self, uri: str, fs: pafs.FileSystem, path: str, info: pafs.FileInfo) -> None:
        self.uri, self.fs, self.path, self.info = uri, fs, path, info

    @abstractmethod
    def read(self) -> ray.data.Dataset:
        """The rows, streamed by Ray Data's reader."""

    @abstractmethod
    def ids(self, id_field: str) -> Iterator[tuple[str, Any]]:
        """(where, id) of every row, read in the driver keeping only the ids."""


class JsonlInput(PromptInput):
    def read(self) -> ray.data.Dataset:
        # Ray's pandas reader keeps a row whose field has another type (e.g. a number for a
        # prompt), so that row, not the whole read, gets the error; lines=True takes no filesystem
        return ray.data.read_json(self.uri if "://" in self.uri else self.path, lines=True)

    def ids(self, id_field: str) -> Iterator[tuple[str, Any]]:
        """Line by line: bad bytes or JSON name their line, as in process."""
        if self.info.type != pafs.FileType.File:
            raise PromptFileError(f"{self.uri}: is a directory; give a JSONL file (or a folder of Parquet files)")
        with self.fs.open_input_stream(self.path) as f:
            for lineno, row in parse_jsonl_lines(io.BufferedReader(f), self.uri):
                if not isinstance(row, dict):
                    raise PromptFileError(f"{self.uri} line {lineno}: expected an object with '{id_field}' and a prompt")
                yield f"{self.uri} line {lineno}", row.get(id_field)


class ParquetInput(PromptInput):
    def read(self) -> ray.data.Dataset:
        return ray.data.read_parquet(self.path, filesystem=self.fs)

    def ids(self, id_field: str) -> Iterator[tuple[str, Any]]:
        """Only the id column is read."""
        try:
            dataset = pads.dataset(self.path, filesystem=self.fs, format="parquet", exclude_invalid_files=False)
            if id_field not in dataset.schema.names:
                raise PromptFileError(f"{self.uri}: no '{id_field}' column; every row needs an id")
            row = 0
            for batch in dataset.to_batches(columns=[id_field]):
                for value in batch.column(0).to_pylist():
                    yield f"{self.uri} row {row}", value
                    row += 1
        except (pa.ArrowException, OSError) as e:
            raise PromptFileError(f"{self.uri}: not a readable Parquet file ({_first_line(e)})") from None


def prompt_input(uri: str) -> PromptInput:
    """The job's input at `uri` (a local path or any URI pyarrow accepts), by its kind."""
    fs, path, _ = filesystem(uri)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise PromptFileError(f"{uri}: no such file")
    if uri.endswith((".jsonl", ".json")):
        return JsonlInput(uri, fs, path, info)
    if uri.endswith(".parquet") or info.type == pafs.FileType.Directory:
        return ParquetInput(uri, fs, path, info)
    raise PromptFileError(f"{uri}: expected a .jsonl/.json file or Parquet (a .parquet file or a folder)")


def read_prompt_rows(uri: str) -> ray.data.Dataset:
    """The input's rows, streamed by Ray Data's readers; the driver never loads them."""
    return prompt_input(uri).read()


def _check_job_record(fs: pafs.FileSystem, out: str, record: dict) -> None:
    """Refuse to resume a folder written with other settings; record them on its first run."""
    path = f"{out}/{JOB_RECORD}"
    if fs.get_file_info(path).type == pafs.FileType.File:
        with fs.open_input_stream(path) as f:
            previous = json.loads(f.read())
        changed = [key for key in record if previous.get(key) != record[key]]
        if changed:
            what = "another sampler configuration" if "sampler" in changed else f"other {', '.join(changed)}"
            raise ValueError(
                f"{out} holds samples drawn with {what}; write to a new output folder or remove it"
            )
        return
    fs.create_dir(out, recursive=True)
    tmp = f"{path}.tmp"
    with fs.open_output_stream(tmp) as f:
        f.write(json.dumps(record, indent=2).encode())
    fs.move(tmp, path)  # atomic on local disks; object stores write whole objects anyway


def _data_files(fs: pafs.FileSystem, out: str) -> set[str]:
    if fs.get_file_info(out).type != pafs.FileType.Directory:
        return set()
    infos = fs.get_file_info(pafs.FileSelector(out, recursive=False))
    return {i.path for i in infos if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
            and not i.base_name.startswith((".", "_"))}  # fmt: skip


@dataclass
class WrittenRows:
    """What a set of output files holds: rows, error rows, and the early-rejection figures summed."""

    rows: int = 0
    errors: int = 0
    early_stopped_requests: int = 0
    early_stop_tokens_left: int = 0


EARLY_STOP_COLUMNS = ("early_stopped_requests", "early_stop_tokens_left")


def _count(fs: pafs.FileSystem, files: Iterable[str]) -> WrittenRows:
    """Rows, error rows and early-stop figures in these files, reading only those columns."""
    written = WrittenRows()
    for path in files:
        with fs.open_input_file(path) as f:
            table = pq.read_table(f, columns=[ERROR_COLUMN, *EARLY_STOP_COLUMNS])
        written.rows += table.num_rows
        written.errors += table.num_rows - table.column(ERROR_COLUMN).null_count
        written.early_stopped_requests += pc.sum(table.column("early_stopped_requests")).as_py() or 0
        written.early_stop_tokens_left += pc.sum(table.column("early_stop_tokens_left")).as_py() or 0
    return written


@contextmanager
def _data_context(checkpoint: CheckpointConfig | None, progress: bool) -> Iterator[None]:
    """Ray Data's process-wide settings for one job (checkpoint, progress bars, its logger's
    level: quiet hides its INFO lines too), restored afterwards for the next job in the process."""
    context = ray.data.DataContext.get_current()
    data_logger = logging.getLogger("ray.data")
    saved = context.checkpoint_config, context.enable_progress_bars, data_logger.level
    context.checkpoint_config, context.enable_progress_bars = checkpoint, progress
    if not progress:
        data_logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        context.checkpoint_config, context.enable_progress_bars, level = saved
        data_logger.setLevel(level)


@contextmanager
def _stage_failures_as_they_are() -> Iterator[None]:
    """While a job runs, Ray Data raises its stage's exceptions unwrapped: by default it wraps them
    in its UserCodeException, whose pickled copy loses its cause, and the driver's RayTaskError
    would hold only Ray's wrapper. The stage's own failures (JobFailed, BadPromptRow) are Ray
    UserCodeExceptions themselves, and it wraps any other exception as Ray Data does
    (actors/stage_base.py), so Ray Data logs them as it always did."""
    context = ray.data.DataContext.get_current()
    saved, context.raise_original_map_exception = context.raise_original_map_exception, True
    try:
        yield
    finally:
        context.raise_original_map_exception = saved


def _stage_failure(error: Exception) -> Exception:
    """The stage's own failure behind Ray's error (`RayTaskError.cause`: a fresh copy, which holds
    none of the failed execution's frames), else Ray's error itself."""
    cause = error.cause if isinstance(error, RayTaskError) else None
    return cause if isinstance(cause, StageFailure) else error


def run_data_job(
    prompts: str,
    out: str,
    config: JobConfig | ProcessorConfig,
    *,
    stage: type[SamplingStage] = PowerSamplingStage,
    address: str | None = None,
    progress: bool = True,
    replicas: list[ReplicaHandle] | None = None,
) -> DataJobSummary:
    """Run every row of `prompts` not yet in `out` through `stage` (by default prompt rows, each
    sampled by `chains_per_prompt` chains); `config` a job config, or a ProcessorConfig (see
    `processor_config`: e.g. `fail_fast`). Batches hold at most `ray.commit_pairs` pairs."""
    settings = commit_sized(processor_config(config))
    job = settings.job
    stage.check_job(job)
    fs, out_path, local = filesystem(out)
    # before Ray starts, hence before any work: the output can be written and is not the input,
    # and every row of the input has its own id (two rows of one id would share their chains)
    check_prompt_ids(prompts, settings.columns)
    if local:
        check_output_folder(out_path, None if "://" in prompts else str(Path(prompts).resolve()), JOB_RECORD)
    elif fs.get_file_info(out_path).type == pafs.FileType.File:
        raise ValueError(f"{out} is a file; the job writes a folder of Parquet files")
    connect_ray(address, progress)
    lock = OutputLock(out_path) if local else None  # object stores have no exclusive create
    start = time.perf_counter()
    if lock:
        lock.acquire()
    try:
        record = {
            "sampler": job.sampler.model_dump(mode="json"),
            "engine": json.loads(engine_identity(job.engine)),
            "chains_per_prompt": job.chains_per_prompt,
            "id_column": settings.columns.id,
            "checkpoint_key": INPUT_KEY_COLUMN,  # older folders were keyed by id alone
        }
        record.update(stage.JOB_RECORD)  # what the stage's rows are; prompt rows record nothing, as older folders
        _check_job_record(fs, out_path, record)
        _refuse_changed_prompts(prompts, out, fs, out_path, settings.columns)
        before = _data_files(fs, out_path)
        summary = DataJobSummary()
        checkpoint = CheckpointConfig(
            id_column=INPUT_KEY_COLUMN,
            checkpoint_path=_join(out, CHECKPOINT_DIR),
            delete_checkpoint_on_success=False,  # a rerun of a finished job must find it: nothing to do
            checkpoint_filter_cls=content_checkpoint_filter(settings.columns),
        )
        with _data_context(checkpoint, progress), _stage_failures_as_they_are():
            prompt_rows = read_prompt_rows(prompts)  # after the checkpoint config: the read filters done ids
            with build_power_sampling_processor(settings, stage=stage, address=address, replicas=replicas) as processor:
                failure = None
                try:
                    # blocks of one batch each: the stage's actor task, hence its fused write, is one
                    # batch, so each batch's file and checkpoint commit as soon as its chains end (one
                    # block of the whole input would commit nothing until the end)
                    batches = prompt_rows.repartition(target_num_rows_per_block=settings.batch_size, strict=True)
                    processor(batches).write_parquet(out_path, filesystem=fs)
                except Exception as e:  # Ray wraps the stage's errors: surface ours as themselves
                    failure = _stage_failure(e)
                if failure is not None:
                    # raised out here, not in the handler (whose exception would become its
                    # __context__): Ray's exception holds the failed execution, whose actor pools
                    # keep their CPUs until it is collected, and the next job in this process (a
                    # rerun, a test) would wait for them
                    gc.collect()
                    raise failure
                snapshot = processor.snapshot()
        summary.engine, summary.resent_requests = snapshot.accounting, snapshot.counters.resent_requests
        summary.streamed_requests = snapshot.counters.streamed_requests
        after = _data_files(fs, out_path)
        summary.new_files = sorted(after - before)
        # files a killed run left uncommitted are deleted by this run's write: they do not count
        summary.skipped = _count(fs, before & after).rows
        written = _count(fs, summary.new_files)
        summary.errors, summary.samples = written.errors, written.rows - written.errors
        summary.early_stopped_requests, summary.early_stop_tokens_left = written.early_stopped_requests, written.early_stop_tokens_left
    finally:
        if lock:
            lock.release()
    summary.wall_time_s = time.perf_counter() - start
    return summary


def commit_sized(config: ProcessorConfig) -> ProcessorConfig:
    """Batches of at most `ray.commit_pairs` (prompt, chain) pairs, each committed once its chains
    end; more of them run at once per stage actor, so as many chains run together as before."""
    job = config.job
    bound = job.ray.commit_pairs
    if bound is None or config.batch_size * job.chains_per_prompt <= bound:
        return config
    batch_size = max(1, bound // job.chains_per_prompt)
    in_flight = config.batch_size * config.batches_per_actor  # prompts running at once per stage actor
    batches_per_actor = min(1024, -(-in_flight // batch_size))
    return config.model_copy(update={"batch_size": batch_size, "batches_per_actor": batches_per_actor})


def check_prompt_ids(prompts: str, columns: InputColumnsConfig) -> int:
    """Stream the input once in the driver before the job: every row has an id that no other row
    has (only the ids are kept). Returns the row count."""
    return check_ids(prompt_input(prompts).ids(columns.id), prompts, columns.id)


def _refuse_changed_prompts(prompts: str, out: str, fs: pafs.FileSystem, out_path: str, columns: InputColumnsConfig) -> None:
    """A rerun into a folder that sampled an id under other prompt fields is refused before any
    work, naming the ids: the folder keeps exactly one row per (prompt, chain). Costs one read of
    the input through Ray Data (the checkpoint filter's own key, so both agree), only on reruns."""
    checkpoint = f"{out_path}/{CHECKPOINT_DIR}"
    if fs.get_file_info(checkpoint).type != pafs.FileType.Directory:
        return
    committed = [
        i.path for i in fs.get_file_info(pafs.FileSelector(checkpoint, recursive=False))
        if i.type == pafs.FileType.File and i.base_name.endswith(".parquet") and ".pending" not in i.base_name
    ]  # fmt: skip
    keys: set[str] = set()
    for file in committed:
        with fs.open_input_file(file) as f:
            keys.update(str(k) for k in pq.read_table(f, columns=[INPUT_KEY_COLUMN]).column(0).to_pylist())
    if not keys:
        return
    ids = {key_id(k) for k in keys}
    with _data_context(None, False):  # a plain read: no checkpoint, no bars
        changed_ids = partial(_changed_ids, keys=keys, ids=ids, columns=columns)
        found = read_prompt_rows(prompts).map_batches(changed_ids, batch_format="pyarrow").take_all()
    changed = sorted({row["id"] for row in found})
    if changed:
        shown = ", ".join(repr(i) for i in changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        raise ValueError(
            f"{out} sampled {len(changed)} id(s) with other prompt text: {shown}; their samples stay and "
            "nothing was sampled. Give each edited prompt a new id, or write to a new output folder"
        )


def _changed_ids(batch: pa.Table, keys: set[str], ids: set[str], columns: InputColumnsConfig) -> pa.Table:
    """The ids of a batch's rows whose id was written under another key (the filter's rule)."""
    present = [c for c in columns.prompt_fields if c in batch.column_names]
    changed = []
    for row in batch.select(present).to_pylist():
        key = input_key(row, columns)
        if key not in keys and key_id(key) in ids:
            changed.append(key_id(key))
    return pa.table({"id": pa.array(changed, pa.string())})


def connect_ray(address: str | None, progress: bool = True) -> None:
    """Join the cluster at `address` (or start a local Ray); an unreachable address is a one-line
    ValueError naming it, not Ray's retries and tracebacks."""
    _check_reachable(address)
    try:
        ensure_ray(address, quiet=not progress)
    except (ConnectionError, TimeoutError) as e:
        raise ValueError(f"--address {address}: cannot connect to the Ray cluster ({_first_line(e)})") from None


def _check_reachable(address: str | None) -> None:
    """A `host:port` address that refuses connections ends the job at once, in one line, rather
    than after Ray's retries and tracebacks (`auto`, `ray://` and RAY_ADDRESS are left to Ray)."""
    if not address or "://" in address or address == "auto" or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    except ValueError:
        raise ValueError(f"--address {address}: expected HOST:PORT of a Ray cluster") from None
    except OSError as e:
        raise ValueError(f"--address {address}: cannot connect to the Ray cluster ({e.strerror or e})") from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _join(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}" if "://" in base else str(Path(base).resolve() / name)
