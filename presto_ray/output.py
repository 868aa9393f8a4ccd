"""Parquet output of samples: the columns, the row builder, the in-process job's atomic write (a temp
file in the same folder, then rename) and its part files as it goes (a killed job resumes from
them), the Ray job's one-writer lock, and reading either back."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from presto_ray.engines.base import Tokenizer
from presto_ray.results import SampleResult

@dataclass(frozen=True)
class FinishedSample:
    """Everything one output row is built from."""

    prompt_id: str
    chain: int
    seed: int
    result: SampleResult
    text: str
    finished_with_eos: bool
    config_json: str  # the SamplerConfig as JSON
    inputs: str | None  # the resume key: a hash of what the sample depends on (job.input_fingerprint)


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    value: Callable[[FinishedSample], object]
    nullable: bool = True


def _stat(name: str, type: pa.DataType = pa.int64()) -> Column:
    return Column(name, type, lambda sample: getattr(sample.result.stats, name))


# The output columns, in order: adding one is one line here (plus its test).
COLUMNS: tuple[Column, ...] = (
    Column("prompt_id", pa.string(), lambda s: s.prompt_id, nullable=False),
    Column("chain", pa.int32(), lambda s: s.chain, nullable=False),
    Column("seed", pa.int64(), lambda s: s.seed, nullable=False),
    Column("text", pa.string(), lambda s: s.text),
    Column("token_ids", pa.list_(pa.int32()), lambda s: list(s.result.token_ids)),
    Column("finished_with_eos", pa.bool_(), lambda s: s.finished_with_eos),
    _stat("rounds"),
    _stat("stream_batches"),
    _stat("transitions"),
    _stat("accepted"),
    _stat("requests"),
    _stat("generated_tokens"),
    _stat("early_stopped_requests"),
    _stat("early_stop_tokens_left"),
    _stat("prompt_tokens"),
    _stat("cached_prompt_tokens"),
    _stat("wall_time_s", pa.float64()),
    Column("config", pa.string(), lambda s: s.config_json),
    Column("inputs", pa.string(), lambda s: s.inputs),
)
# Files we write say so in their schema metadata: `sample --out` overwrites an existing file only
# when it is one of ours (or has our columns, as files written before the mark do).
OUTPUT_MARK = {b"presto_ray": b"samples"}
SAMPLE_SCHEMA = pa.schema([pa.field(c.name, c.type, nullable=c.nullable) for c in COLUMNS], metadata=OUTPUT_MARK)


class OutputPathError(ValueError):
    """An output path the job must not or cannot write; the message names it (exit status 2)."""


def io_error_text(error: OSError) -> str:
    """An OSError in a few words: the system's text for its errno ("No space left on device"),
    not pyarrow's longer wrapping of it, else its own text."""
    if error.errno:
        return os.strerror(error.errno)
    text = error.strerror or str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def is_sample_file(path: str | Path) -> bool:
    """Whether `path` is a Parquet file this tool wrote (our mark, or exactly our leading columns)."""
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError):
        return False
    if (schema.metadata or {}).get(b"presto_ray") == OUTPUT_MARK[b"presto_ray"]:
        return True
    return schema.names[: len(COLUMNS)] == [c.name for c in COLUMNS]


def _overlap(out: Path, prompts: Path) -> str | None:
    """How the output and the prompts overlap (one is, holds or lies inside the other), or None."""
    out, prompts = out.resolve(), prompts.resolve()
    same = out == prompts or (out.exists() and prompts.exists() and os.path.samefile(out, prompts))
    if same:
        return f"is the prompt file {prompts}"
    if out in prompts.parents:
        return f"holds the prompts {prompts}"
    if prompts in out.parents:
        return f"lies inside the prompts {prompts}"
    return None


def _probe_writable(directory: Path, out: str | Path) -> None:
    """Create `directory` (and its parents) and a temp file in it, now, before any work."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".presto-ray-probe.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OutputPathError(f"--out {out}: cannot write there ({e.strerror or e})") from None


def check_output_file(out: str | Path, prompts: str | Path | None = None) -> None:
    """Refuse, before any sampling, an output file the in-process job must not or cannot write:
    the prompts themselves (or a folder holding them), a folder, an existing file that is not a
    sample file of ours, a place where no file can be created."""
    path = Path(out)
    if prompts is not None and "://" not in str(prompts) and (how := _overlap(path, Path(prompts))):
        raise OutputPathError(f"--out {out} {how}; write the samples to another file")
    if path.is_dir():
        raise OutputPathError(f"--out {out}: is a directory; give a file path (sample --ray writes folders)")
    if path.exists() or path.is_symlink():
        if not path.is_file():
            raise OutputPathError(f"--out {out}: exists and is not a regular file")
        if not is_sample_file(path):
            raise OutputPathError(
                f"--out {out}: exists and is not a presto-ray sample file; refusing to overwrite it "
                "(remove it or choose another --out)"
            )
    _probe_writable(path.parent, out)


def check_output_folder(out: str | Path, prompts: str | None, record_name: str) -> None:
    """The same for the Ray job's output folder (a local path): not the prompts, not inside them,
    not holding them, not a file, not a folder of other files (no `record_name` job record), writable."""
    path = Path(out)
    if prompts is not None and "://" not in prompts and (how := _overlap(path, Path(prompts))):
        raise OutputPathError(f"--out {out} {how}; write the samples to another folder")
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"{out} is a file; the job writes a folder of Parquet files")
    if path.is_dir() and not (path / record_name).exists():
        if any(not p.name.startswith(".") for p in path.iterdir()):
            raise OutputPathError(
                f"--out {out}: is a folder of other files (no presto-ray job record {record_name}); "
                "write to a new or empty folder"
            )
    _probe_writable(path, out)


def sample_row(
    prompt_id: str,
    chain: int,
    seed: int,
    result: SampleResult,
    tokenizer: Tokenizer,
    config_json: str,
    inputs: str | None = None,
) -> dict:
    """One output row (a dict with the SAMPLE_SCHEMA columns): the sample, its text and statistics."""
    tokens = result.token_ids
    finished = FinishedSample(
        prompt_id, chain, seed, result, tokenizer.decode(tokens),
        bool(tokens) and tokens[-1] == tokenizer.eos_token_id, config_json, inputs,
    )  # fmt: skip
    return {column.name: column.value(finished) for column in COLUMNS}


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path beside `path`; on success it replaces `path` in one rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_parquet_atomic(rows: list[dict], path: str | Path, schema: pa.Schema = SAMPLE_SCHEMA) -> None:
    table = pa.Table.from_pylist(rows, schema=schema)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def write_json_atomic(data: dict | list, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n")


class PartCheckpoint:
    """The in-process job's finished rows on disk as it goes, so a killed job loses only the
    pairs in flight (and at most `max_rows` rows or `max_s` seconds of finished ones).

    Parts are Parquet files in `.<out name>.parts/` beside the output, each written atomically
    (temp file, rename) once `max_rows` rows are pending or `max_s` seconds have passed since the
    last part. A rerun into the same `--out` reads them back (`load`): the job keeps a row whose
    `inputs` key equals the one it computes for that (prompt, chain) and samples the rest. The
    output file itself is still written once, atomically, at the end; then the parts go.
    """

    def __init__(self, out: str | Path, max_rows: int = 16, max_s: float = 5.0) -> None:
        out = Path(out)
        self.folder = out.parent / f".{out.name}.parts"
        self.max_rows, self.max_s = max_rows, max_s
        self._pending: list[dict] = []
        self._last = time.monotonic()
        self._next = 0

    def load(self) -> list[dict]:
        """Rows of the parts a killed run left (an unreadable part, e.g. cut by a full disk, is skipped)."""
        rows: list[dict] = []
        for part in sorted(self.folder.glob("part-*.parquet")) if self.folder.is_dir() else []:
            try:
                rows.extend(pq.read_table(part).to_pylist())
            except (pa.ArrowException, OSError):
                continue
            self._next = max(self._next, int(part.stem.split("-")[1]) + 1)
        return rows

    @property
    def files(self) -> int:
        """Part files on disk: this run's and those a killed run left."""
        return len(list(self.folder.glob("part-*.parquet"))) if self.folder.is_dir() else 0

    def add(self, row: dict) -> None:
        self._pending.append(row)
        if len(self._pending) >= self.max_rows or time.monotonic() - self._last >= self.max_s:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_parquet_atomic(self._pending, self.folder / f"part-{self._next:06d}.parquet")
            self._next += 1
            self._pending = []
        self._last = time.monotonic()

    def remove(self) -> None:
        """After the output is written: the parts are in it."""
        for part in self.folder.glob("*") if self.folder.is_dir() else []:
            part.unlink(missing_ok=True)
        if self.folder.is_dir():
            self.folder.rmdir()


class OutputLock:
    """One live writer per output folder: `.presto-ray.lock` holds the writer's pid and host.

    A lock left by a process that died on this host is stale and taken over; a lock from another
    host cannot be checked from here, so it is refused with a message saying how to clear it.
    (pyarrow and pandas skip dot-files when they read the folder.)
    """

    NAME = ".presto-ray.lock"

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / self.NAME
        self._held = False

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):  # a second try after removing a stale lock
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = self._owner()
                if owner is not None and owner.get("host") == socket.gethostname() and not _alive(owner.get("pid")):
                    self.path.unlink(missing_ok=True)  # its writer died (killed, crashed): stale
                    continue
                raise ValueError(self._held_message(owner)) from None
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}, f)
            except OSError as e:  # a full disk: no empty lock file stays behind
                self.path.unlink(missing_ok=True)
                raise OutputPathError(f"--out {self.path.parent}: cannot write there ({io_error_text(e)})") from None
            self._held = True
            return
        raise ValueError(self._held_message(self._owner()))

    def release(self) -> None:
        if self._held:
            self.path.unlink(missing_ok=True)
            self._held = False

    def _owner(self) -> dict | None:
        try:
            owner = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return owner if isinstance(owner, dict) else None

    def _held_message(self, owner: dict | None) -> str:
        who = f"process {owner.get('pid')} on {owner.get('host')}" if owner else "another process"
        return (
            f"{self.path.parent} is being written by {who} (lock file {self.path}); two writers would "
            "sample every pair twice. Wait for it, write to another folder, or remove the lock file "
            "if that job is no longer running"
        )


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True


def _parquet_files(directory: Path) -> list[Path]:
    """The Parquet files of a folder, without hidden ones (temp files, Ray's checkpoint folder)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("*.parquet") if not p.name.startswith((".", "_")))


def read_samples(path: str | Path) -> pa.Table:
    """A sample file or a folder of Parquet files (the Ray job's output), as one table."""
    path = Path(path)
    if path.is_dir():
        files = _parquet_files(path)
        if not files:
            return SAMPLE_SCHEMA.empty_table()
        return pa.concat_tables([pq.read_table(f) for f in files], promote_options="default")
    return pq.read_table(path)
