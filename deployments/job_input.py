"""The Ray Data job's input, by its kind (JSONL or Parquet), and the snapshot the job reads.

A job reads a snapshot of its input, never the file itself: rows appended to a JSONL file while
a job ran were read by Ray Data's reader after the driver had checked the ids, so they were
sampled unchecked (an id that already existed got its chains twice, under two input keys, and a
broken line failed the job with Ray Data's tracebacks). Before Ray starts, the driver copies the
input into the output folder (`.presto-ray-input/<run>/`, on the output's filesystem, which every
node of a cluster reaches, as for the job's files) and checks every row's id on the bytes it
copies; the check, the refusal of edited prompts and the sampling all read that copy, and the
copy goes when the job ends. The same holds for object storage URIs (an input URI is copied
through the driver to the output URI: one read and one write of the input per run; objects can
be replaced between two reads, and pyarrow's filesystems pin no version). A file that changed
while the job ran is said in its summary: the run sampled the rows it had at the start.
"""

from __future__ import annotations

import io
import os
import secrets
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import ray.data

from presto_ray.output import OutputPathError, io_error_text
from presto_ray.prompts import PromptFileError, check_ids, parse_jsonl_lines

SNAPSHOTS = ".presto-ray-input"  # inside the output folder; readers skip dot-folders
CHUNK = 1 << 20


def filesystem(uri: str) -> tuple[pafs.FileSystem, str, bool]:
    """(filesystem, path in it, is local) for a local path or any URI pyarrow accepts."""
    if "://" not in uri:
        path = str(Path(uri).resolve())
        return pafs.LocalFileSystem(), path, True
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path, isinstance(fs, pafs.LocalFileSystem)


def join(base: str, name: str) -> str:
    """`name` inside the folder or URI `base`."""
    return f"{base.rstrip('/')}/{name}" if "://" in base else str(Path(base).resolve() / name)


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class PromptInput(ABC):
    """The prompt file or folder of a job, by its kind: JSONL (`.jsonl`, `.json`) or Parquet (a
    `.parquet` file or a folder). `prompt_input` is the one place that tells them apart. `name`
    is what messages call it: the user's file, also for its snapshot."""

    def __init__(self, uri: str, fs: pafs.FileSystem, path: str, info: pafs.FileInfo, name: str | None = None) -> None:
        self.uri, self.fs, self.path, self.info = uri, fs, path, info
        self.name = name or uri

    @abstractmethod
    def read(self) -> ray.data.Dataset:
        """The rows, streamed by Ray Data's reader."""

    @abstractmethod
    def files(self) -> list[str]:
        """The files the rows are read from (paths in `fs`)."""

    @abstractmethod
    def snapshot(self, folder: str, folder_uri: str, fs: pafs.FileSystem, id_field: str) -> tuple[PromptInput, int]:
        """Copy the input into `folder` (`folder_uri` as readers name it) on `fs`, checking every
        row's id on what is copied: (the copy, its row count). PromptFileError for a bad row."""

    def stamp(self) -> tuple[tuple[str, int | None, int | None], ...]:
        """(path, size, mtime in ns) of each file: what changes when the input is written."""
        infos = self.fs.get_file_info(self.files())
        return tuple((i.path, i.size, i.mtime_ns) for i in infos)


class JsonlInput(PromptInput):
    def read(self) -> ray.data.Dataset:
        # Ray's pandas reader keeps a row whose field has another type (e.g. a number for a
        # prompt), so that row, not the whole read, gets the error; lines=True takes no filesystem
        return ray.data.read_json(self.uri if "://" in self.uri else self.path, lines=True)

    def files(self) -> list[str]:
        return [self.path]

    def snapshot(self, folder: str, folder_uri: str, fs: pafs.FileSystem, id_field: str) -> tuple[PromptInput, int]:
        """Line by line, in one pass: each line is checked (bad bytes or JSON name their line, as
        in process) and written to the copy, so the copy holds exactly the lines checked."""
        if self.info.type != pafs.FileType.File:
            raise PromptFileError(f"{self.name}: is a directory; give a JSONL file (or a folder of Parquet files)")
        base = Path(self.path).name
        target = f"{folder}/{base}"
        with _written(fs, target, folder_uri) as out, _read(self) as source:

            def copied() -> Iterator[bytes]:
                for raw in io.BufferedReader(source, CHUNK):
                    _write(out, raw, folder_uri)
                    yield raw

            rows = ((f"{self.name} line {n}", _row_id(row, self.name, n, id_field)) for n, row in parse_jsonl_lines(copied(), self.name))
            count = check_ids(rows, self.name, id_field)
        return JsonlInput(join(folder_uri, base), fs, target, fs.get_file_info(target), self.name), count


class ParquetInput(PromptInput):
    def read(self) -> ray.data.Dataset:
        return ray.data.read_parquet(self.path, filesystem=self.fs)

    def _dataset(self) -> pads.Dataset:
        try:
            return pads.dataset(self.path, filesystem=self.fs, format="parquet", exclude_invalid_files=False)
        except (pa.ArrowException, OSError) as e:
            raise PromptFileError(f"{self.name}: not a readable Parquet file ({first_line(e)})") from None

    def files(self) -> list[str]:
        return list(self._dataset().files)

    def snapshot(self, folder: str, folder_uri: str, fs: pafs.FileSystem, id_field: str) -> tuple[PromptInput, int]:
        """The file, or the folder's files at their relative paths (partition folders kept), copied
        byte for byte; then the copy's id column is checked."""
        if self.info.type == pafs.FileType.File:
            pairs, target = [(self.path, f"{folder}/{Path(self.path).name}")], f"{folder}/{Path(self.path).name}"
        else:
            root = self.path.rstrip("/")
            pairs = [(f, f"{folder}/data/{f[len(root) + 1:]}") for f in self.files()]
            target = f"{folder}/data"
            fs.create_dir(target, recursive=True)
        for source, copy in pairs:
            fs.create_dir(copy.rsplit("/", 1)[0], recursive=True)
            with _written(fs, copy, folder_uri) as out, _read(self, source) as f:
                while chunk := f.read(CHUNK):
                    _write(out, chunk, folder_uri)
        uri = join(folder_uri, target[len(folder) + 1:])
        snapshot = ParquetInput(uri, fs, target, fs.get_file_info(target), self.name)
        return snapshot, check_ids(snapshot.ids(id_field), self.name, id_field)

    def ids(self, id_field: str) -> Iterator[tuple[str, Any]]:
        """(where, id) of every row; only the id column is read."""
        try:
            dataset = self._dataset()
            if id_field not in dataset.schema.names:
                raise PromptFileError(f"{self.name}: no '{id_field}' column; every row needs an id")
            row = 0
            for batch in dataset.to_batches(columns=[id_field]):
                for value in batch.column(0).to_pylist():
                    yield f"{self.name} row {row}", value
                    row += 1
        except (pa.ArrowException, OSError) as e:
            raise PromptFileError(f"{self.name}: not a readable Parquet file ({first_line(e)})") from None


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


class InputSnapshot:
    """The copy of a job's input that the job reads (`input`), in `<out>/.presto-ray-input/<run>/`,
    and the input's files as they were when it was taken (`changed()` compares them with now)."""

    def __init__(self, source: PromptInput, out: str, fs: pafs.FileSystem, out_path: str, id_field: str) -> None:
        self.source, self.fs = source, fs
        run = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{secrets.token_hex(4)}"
        self.folder = f"{out_path}/{SNAPSHOTS}/{run}"
        self._stamp = source.stamp()
        try:
            fs.create_dir(self.folder, recursive=True)
            self.input, self.rows = source.snapshot(self.folder, join(out, f"{SNAPSHOTS}/{run}"), fs, id_field)
        except BaseException:
            self.remove()
            raise
        self._changed_during_copy = self._stamp != source.stamp()  # the copy may end in half a line

    def changed(self) -> bool:
        """Whether the input's files differ now from when the snapshot was taken."""
        try:
            return self._changed_during_copy or self.source.stamp() != self._stamp
        except (OSError, PromptFileError):
            return True  # gone or unreadable: not what was sampled

    def remove(self) -> None:
        """The copy, and `.presto-ray-input` with it when no other run's copy is there."""
        parent = self.folder.rsplit("/", 1)[0]
        try:
            self.fs.delete_dir(self.folder)
            if not self.fs.get_file_info(pafs.FileSelector(parent, allow_not_found=True)):
                self.fs.delete_dir(parent)
        except (OSError, FileNotFoundError):
            pass

    @staticmethod
    def remove_stale(fs: pafs.FileSystem, out_path: str) -> None:
        """Snapshots killed runs left (only while holding the folder's lock: no other live run)."""
        root = f"{out_path}/{SNAPSHOTS}"
        if fs.get_file_info(root).type == pafs.FileType.Directory:
            fs.delete_dir(root)


def _row_id(row: Any, name: str, lineno: int, id_field: str) -> Any:
    if not isinstance(row, dict):
        raise PromptFileError(f"{name} line {lineno}: expected an object with '{id_field}' and a prompt")
    return row.get(id_field)


class _written:
    """An output stream on the snapshot's filesystem whose failures (a full disk) are one
    OutputPathError; on any failure the partial copy is deleted."""

    def __init__(self, fs: pafs.FileSystem, path: str, out: str) -> None:
        self.fs, self.path, self.out = fs, path, out

    def __enter__(self) -> pa.NativeFile:
        try:
            self.stream = self.fs.open_output_stream(self.path)
        except OSError as e:
            raise _write_error(self.out, e) from None
        return self.stream

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        try:
            self.stream.close()
        except OSError as e:
            if exc is None:
                self._delete()
                raise _write_error(self.out, e) from None
        if exc is not None:
            self._delete()

    def _delete(self) -> None:
        try:
            self.fs.delete_file(self.path)
        except OSError:
            pass


def _write(out: pa.NativeFile, data: bytes, folder_uri: str) -> None:
    try:
        out.write(data)
    except OSError as e:
        raise _write_error(folder_uri, e) from None


def _write_error(where: str, error: OSError) -> OutputPathError:
    out = where.split(f"/{SNAPSHOTS}/")[0]
    return OutputPathError(f"--out {out}: cannot write the input's snapshot there ({io_error_text(error)})")


class _read:
    """An input stream of the input whose failures are one PromptFileError naming the input."""

    def __init__(self, source: PromptInput, path: str | None = None) -> None:
        self.source, self.path = source, path or source.path

    def __enter__(self) -> pa.NativeFile:
        try:
            self.stream = self.source.fs.open_input_stream(self.path)
        except OSError as e:
            raise PromptFileError(f"{self.source.name}: cannot read ({io_error_text(e)})") from None
        return self.stream

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self.stream.close()
        if isinstance(exc, OSError) and not isinstance(exc, OutputPathError):
            raise PromptFileError(f"{self.source.name}: cannot read ({io_error_text(exc)})") from None

