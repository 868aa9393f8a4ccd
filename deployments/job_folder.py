"""The Ray Data job's output folder beyond its data files: the job record, the committed keys
(Ray Data's checkpoint), what the files hold, and what a failed write left.

- `.presto-ray-job.json` records the sampler config, engine and model identity and chain count of
  the folder's first run; a rerun with other ones is refused (written atomically: a temp file,
  then a move; a full disk leaves no temp file).
- `.ray-checkpoint/` is Ray Data's two-phase commit: a pending checkpoint, the data file, the
  commit. A rerun refuses up front an id the folder sampled under other prompt fields.
- After a failed write (a full disk) the data files of pending checkpoints are half-written:
  they are removed with their pending checkpoints, as the next run's read would remove them, so
  the folder holds only committed, whole files.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import partial
from typing import Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from deployments.job_input import PromptInput
from presto_ray.data_columns import ERROR_COLUMN, INPUT_KEY_COLUMN, InputColumnsConfig, input_key, key_id
from presto_ray.output import OutputPathError, io_error_text

CHECKPOINT_DIR = ".ray-checkpoint"  # inside the output folder; readers skip dot-folders
JOB_RECORD = ".presto-ray-job.json"
PENDING = ".pending.parquet"  # Ray Data's pending checkpoints (ray.data.checkpoint.checkpoint_writer)
EARLY_STOP_COLUMNS = ("early_stopped_requests", "early_stop_tokens_left")


def check_job_record(fs: pafs.FileSystem, out: str, record: dict) -> None:
    """Refuse to resume a folder written with other settings; record them on its first run."""
    path = f"{out}/{JOB_RECORD}"
    if fs.get_file_info(path).type == pafs.FileType.File:
        with fs.open_input_stream(path) as f:
            previous = json.loads(f.read())
        changed = [key for key in record if previous.get(key) != record[key]]
        if changed:
            what = "another sampler configuration" if "sampler" in changed else f"other {', '.join(changed)}"
            raise ValueError(f"{out} holds samples drawn with {what}; write to a new output folder or remove it")
        return
    tmp = f"{path}.tmp"
    try:
        fs.create_dir(out, recursive=True)
        with fs.open_output_stream(tmp) as f:
            f.write(json.dumps(record, indent=2).encode())
        fs.move(tmp, path)  # atomic on local disks; object stores write whole objects anyway
    except OSError as e:
        _delete(fs, tmp)
        raise OutputPathError(f"--out {out}: cannot write the job record {JOB_RECORD} ({io_error_text(e)})") from None


def data_files(fs: pafs.FileSystem, out: str) -> set[str]:
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


def count_rows(fs: pafs.FileSystem, files: Iterable[str]) -> WrittenRows:
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


def _checkpoint_files(fs: pafs.FileSystem, out_path: str) -> list[pafs.FileInfo]:
    checkpoint = f"{out_path}/{CHECKPOINT_DIR}"
    if fs.get_file_info(checkpoint).type != pafs.FileType.Directory:
        return []
    infos = fs.get_file_info(pafs.FileSelector(checkpoint, recursive=False))
    return [i for i in infos if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")]


def refuse_changed_prompts(source: PromptInput, out: str, fs: pafs.FileSystem, out_path: str, columns: InputColumnsConfig) -> None:
    """A rerun into a folder that sampled an id under other prompt fields is refused before any
    work, naming the ids: the folder keeps exactly one row per (prompt, chain). Costs one read of
    the input (the job's snapshot) through Ray Data (the checkpoint filter's own key, so both
    agree), only on reruns. Call inside a plain Ray Data context (no checkpoint)."""
    keys: set[str] = set()
    for info in _checkpoint_files(fs, out_path):
        if not info.base_name.endswith(PENDING):
            with fs.open_input_file(info.path) as f:
                keys.update(str(k) for k in pq.read_table(f, columns=[INPUT_KEY_COLUMN]).column(0).to_pylist())
    if not keys:
        return
    ids = {key_id(k) for k in keys}
    changed_ids = partial(_changed_ids, keys=keys, ids=ids, columns=columns)
    found = source.read().map_batches(changed_ids, batch_format="pyarrow").take_all()
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


def discard_uncommitted(fs: pafs.FileSystem, out_path: str, quiet_s: float = 2.0, limit_s: float = 30.0) -> int:
    """After a failed job: remove each data file of a pending checkpoint (its write never
    committed, so it may be cut short: a full disk) and the pending checkpoint, as the next run
    would. Waits first until nothing in the folder has changed for `quiet_s` (at most `limit_s`):
    Ray Data cancels a failed execution's tasks without waiting for them. The files removed."""
    deadline = time.monotonic() + limit_s
    last = None
    while time.monotonic() < deadline:
        now = _state(fs, out_path)
        if now == last:
            break
        last = now
        time.sleep(quiet_s)
    pending = [i for i in _checkpoint_files(fs, out_path) if i.base_name.endswith(PENDING)]
    prefixes = tuple(i.base_name[: -len(PENDING)] for i in pending)
    removed = 0
    for path in sorted(data_files(fs, out_path)) if prefixes else []:
        if path.rsplit("/", 1)[-1].startswith(prefixes):
            removed += _delete(fs, path)
    for info in pending:
        _delete(fs, info.path)
    return removed


def _state(fs: pafs.FileSystem, out_path: str) -> tuple:
    infos = fs.get_file_info(list(data_files(fs, out_path))) + _checkpoint_files(fs, out_path)
    return tuple(sorted((i.path, i.size, i.mtime_ns) for i in infos))


def _delete(fs: pafs.FileSystem, path: str) -> int:
    try:
        fs.delete_file(path)
        return 1
    except (OSError, FileNotFoundError):
        return 0
