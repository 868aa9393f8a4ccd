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
(`.presto-ray-job.json`; the folder's other files: deployments/job_folder.py). The job reads a
snapshot of its input taken before Ray starts (deployments/job_input.py), so rows written to
the input while it runs are neither read nor sampled.
"""

from __future__ import annotations

import errno
import gc
import json
import logging
import os
import socket
import time
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

import pyarrow.fs as pafs
import ray.data
from ray.data.checkpoint import CheckpointConfig
from ray.exceptions import RayTaskError

from actors.cluster import ensure_ray
from actors.sampling_stage import PowerSamplingStage
from actors.stage_base import BadPromptRow, JobFailed, SamplingStage, StageFailure
from deployments.checkpoint_filter import content_checkpoint_filter
from deployments.head_watch import HeadWatch
from deployments.job_folder import CHECKPOINT_DIR, JOB_RECORD, check_job_record, count_rows, data_files, discard_uncommitted, refuse_changed_prompts
from deployments.job_input import InputSnapshot, filesystem, first_line, join, prompt_input
from deployments.node_watch import job_demands, node_watch
from deployments.processor import ProcessorConfig, build_power_sampling_processor, processor_config
from presto_ray.data_columns import INPUT_KEY_COLUMN
from presto_ray.engines.base import CallAccounting
from presto_ray.job import JobConfig, engine_identity
from presto_ray.output import OutputLock, OutputPathError, check_output_folder, io_error_text

__all__ = [
    "CHECKPOINT_DIR", "BadPromptRow", "DataJobSummary", "JobFailed", "commit_sized", "connect_ray", "filesystem",
    "processor_config", "run_data_job",
]  # fmt: skip

if TYPE_CHECKING:
    from actors.engine_replica import ReplicaHandle

# errors of the output's storage, not of the job: a write failing with one is the user's to fix
STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}


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
    input_changed: bool = False  # the input was written while the job ran (its snapshot was sampled)
    incomplete_coordinators: int = 0  # coordinators restarted or lost under the job: its figures miss their work

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
        ] + ([f"resumed              {self.skipped} finished pairs skipped"] if self.skipped else []) + (
            ["input changed        while the job ran: it sampled the rows the input had at its start; rerun for the rest"]
            if self.input_changed else []
        ) + (
            [f"engine figures       partial: {self.incomplete_coordinators} coordinator(s) restarted or lost under the job "
             "(their counts before it are gone; the samples are whole)"]
            if self.incomplete_coordinators else []
        )  # fmt: skip


@contextmanager
def _data_context(checkpoint: CheckpointConfig | None, progress: bool, callbacks: Sequence[type] = ()) -> Iterator[None]:
    """Ray Data's process-wide settings for one job (checkpoint, progress bars, execution
    callbacks, its logger's level: quiet hides its INFO lines too), restored afterwards for the
    next job in the process."""
    context = ray.data.DataContext.get_current()
    data_logger, bars_logger = logging.getLogger("ray.data"), logging.getLogger("ray.data._internal.progress")
    saved = context.checkpoint_config, context.enable_progress_bars, data_logger.level, bars_logger.level
    saved_callbacks = list(context.custom_execution_callback_classes)
    context.checkpoint_config, context.enable_progress_bars = checkpoint, progress
    context.custom_execution_callback_classes = [*saved_callbacks, *callbacks]
    if not progress:
        data_logger.setLevel(logging.WARNING)
        bars_logger.setLevel(logging.ERROR)  # its "Progress bars disabled. To enable, ..." advice: asked for
    try:
        yield
    finally:
        context.checkpoint_config, context.enable_progress_bars, level, bars_level = saved
        context.custom_execution_callback_classes = saved_callbacks
        data_logger.setLevel(level)
        bars_logger.setLevel(bars_level)


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


class _HeldErrors(logging.Filter):
    """Ray Data's ERROR lines on the console, held while a job runs (its log file keeps them)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.said_in_one_line = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            self.records.append(record)
            return False
        return True


@contextmanager
def _ray_data_errors() -> Iterator[_HeldErrors]:
    """Ray Data logs a failed execution's exception on the console, a traceback or two (~250
    lines for a write on a full disk), before raising it. Held while the job runs: dropped when
    the failure is ours to say in one line (a stage failure, the output's storage), shown
    otherwise."""
    held = _HeldErrors()
    handlers = [h for h in logging.getLogger("ray.data").handlers if isinstance(h, logging.StreamHandler)
                and not isinstance(h, logging.FileHandler) and type(h).__name__ != "SessionFileHandler"]  # fmt: skip
    for handler in handlers:
        handler.addFilter(held)
    try:
        yield held
    finally:
        for handler in handlers:
            handler.removeFilter(held)
        if not held.said_in_one_line:
            for record in held.records:
                for handler in handlers:
                    handler.handle(record)


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
    `processor_config`: e.g. `fail_fast`). Batches hold at most `ray.commit_pairs` pairs. The
    rows are those of a snapshot of `prompts` taken before Ray starts."""
    settings = commit_sized(processor_config(config))
    job = settings.job
    stage.check_job(job)
    fs, out_path, local = filesystem(out)
    source = prompt_input(prompts)
    new_folder = fs.get_file_info(out_path).type == pafs.FileType.NotFound
    # before Ray starts, hence before any work: the output can be written and is not the input
    if local:
        check_output_folder(out_path, None if "://" in prompts else str(Path(prompts).resolve()), JOB_RECORD)
    elif fs.get_file_info(out_path).type == pafs.FileType.File:
        raise ValueError(f"{out} is a file; the job writes a folder of Parquet files")
    lock = OutputLock(out_path) if local else None  # object stores have no exclusive create
    start = time.perf_counter()
    snapshot: InputSnapshot | None = None
    started = False
    try:
        if lock:
            lock.acquire()
            InputSnapshot.remove_stale(fs, out_path)  # no other live run: what is there, killed runs left
        # the job reads this copy, whose every row has its own id (two rows of one id would share
        # their chains), so rows written to the input from now on are not sampled
        snapshot = InputSnapshot(source, out, fs, out_path, settings.columns.id)
        connect_ray(address, progress)
        record = {
            "sampler": job.sampler.model_dump(mode="json"),
            "engine": json.loads(engine_identity(job.engine)),
            "chains_per_prompt": job.chains_per_prompt,
            "id_column": settings.columns.id,
            "checkpoint_key": INPUT_KEY_COLUMN,  # older folders were keyed by id alone
        }
        record.update(stage.JOB_RECORD)  # what the stage's rows are; prompt rows record nothing, as older folders
        check_job_record(fs, out_path, record)
        with _data_context(None, False):  # a plain read: no checkpoint, no bars
            refuse_changed_prompts(snapshot.input, out, fs, out_path, settings.columns)
        before = data_files(fs, out_path)
        checkpoint = CheckpointConfig(
            id_column=INPUT_KEY_COLUMN,
            checkpoint_path=join(out, CHECKPOINT_DIR),
            delete_checkpoint_on_success=False,  # a rerun of a finished job must find it: nothing to do
            checkpoint_filter_cls=content_checkpoint_filter(settings.columns),
        )
        # a part with no live node to run on (its nodes lost, none joined) ends the job in one line
        timeout = job.ray.missing_node_timeout_s
        watch = [] if timeout is None else [node_watch(job_demands(job), timeout)]
        started = True
        with _head_watch(address, job.ray.head_loss_timeout_s), _data_context(checkpoint, progress, watch), \
                _stage_failures_as_they_are(), _ray_data_errors() as held:  # fmt: skip
            prompt_rows = snapshot.input.read()  # after the checkpoint config: the read filters done ids
            with build_power_sampling_processor(settings, stage=stage, address=address, replicas=replicas) as processor:
                failure = None
                try:
                    # blocks of one batch each: the stage's actor task, hence its fused write, is one
                    # batch, so each batch's file and checkpoint commit as soon as its chains end (one
                    # block of the whole input would commit nothing until the end)
                    batches = prompt_rows.repartition(target_num_rows_per_block=settings.batch_size, strict=True)
                    processor(batches).write_parquet(out_path, filesystem=fs)
                except Exception as e:  # Ray wraps the stage's errors: surface ours as themselves
                    failure = _own_failure(e, out)
                if failure is not None:
                    # raised out here, not in the handler (whose exception would become its
                    # __context__): Ray's exception holds the failed execution, whose actor pools
                    # keep their CPUs until it is collected, and the next job in this process (a
                    # rerun, a test) would wait for them
                    gc.collect()
                    held.said_in_one_line = isinstance(failure, (StageFailure, OutputPathError))
                    raise failure
                # every row is written: a coordinator lost since (its node gone at the very end) costs
                # the summary its figures, not the job
                figures = processor.snapshot(lost_ok=True)
        summary = DataJobSummary(input_changed=snapshot.changed(), incomplete_coordinators=figures.incomplete_shards)
        summary.engine, summary.resent_requests = figures.accounting, figures.counters.resent_requests
        summary.streamed_requests = figures.counters.streamed_requests
        after = data_files(fs, out_path)
        summary.new_files = sorted(after - before)
        # files a killed run left uncommitted are deleted by this run's write: they do not count
        summary.skipped = count_rows(fs, before & after).rows
        written = count_rows(fs, summary.new_files)
        summary.errors, summary.samples = written.errors, written.rows - written.errors
        summary.early_stopped_requests, summary.early_stop_tokens_left = written.early_stopped_requests, written.early_stop_tokens_left
    except BaseException:
        if started:  # a write cut short (a full disk, a failed job) leaves no half-written file
            try:
                discard_uncommitted(fs, out_path)
            except Exception:  # the failure itself is what to say; the next run's read cleans up too
                pass
        elif new_folder and local:  # refused before any work: the folder it made goes too
            _remove_if_empty(Path(out_path), snapshot, lock)
        raise
    finally:
        if snapshot is not None:
            snapshot.remove()
        if lock:
            lock.release()
    summary.wall_time_s = time.perf_counter() - start
    return summary


def _head_watch(address: str | None, timeout_s: float | None) -> AbstractContextManager[object]:
    """A job on a running cluster (not the local Ray this driver started, whose head is this
    machine) stops in one line once the head is gone (deployments/head_watch.py)."""
    joined = address or os.environ.get("RAY_ADDRESS", "local") not in ("", "local")  # "local": a Ray of its own
    if timeout_s is None or not joined:
        return nullcontext()
    return HeadWatch(ray.get_runtime_context().gcs_address, timeout_s)


def _own_failure(error: Exception, out: str) -> Exception:
    """The failure to raise: the stage's own (`RayTaskError.cause`: a fresh copy, which holds none
    of the failed execution's frames), a write that the output's storage refused (a full disk:
    one OutputPathError), else Ray's error itself."""
    cause = error.cause if isinstance(error, RayTaskError) else None
    if isinstance(cause, StageFailure):
        return cause
    storage = next((e for e in (cause, error) if isinstance(e, OSError) and e.errno in STORAGE_ERRNOS), None)
    if storage is not None:
        return OutputPathError(
            f"--out {out}: cannot write the samples ({io_error_text(storage)}); the files committed so far "
            "are kept (a rerun resumes from them) and the one cut short is removed"
        )
    return error


def _remove_if_empty(folder: Path, snapshot: InputSnapshot | None, lock: OutputLock | None) -> None:
    if snapshot is not None:
        snapshot.remove()
    if lock:
        lock.release()
    for empty in (folder / ".presto-ray-input", folder):
        try:
            empty.rmdir()
        except OSError:
            pass


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


def connect_ray(address: str | None, progress: bool = True) -> None:
    """Join the cluster at `address` (or start a local Ray); an unreachable address is a one-line
    ValueError naming it, not Ray's retries and tracebacks."""
    _check_reachable(address)
    try:
        ensure_ray(address, quiet=not progress)
    except (ConnectionError, TimeoutError) as e:
        raise ValueError(f"--address {address}: cannot connect to the Ray cluster ({first_line(e)})") from None


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
