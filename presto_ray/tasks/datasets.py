"""Benchmark datasets from the user's files: JSONL or Parquet, a local path or any URI pyarrow's
file systems read (s3://, gs://, hdfs://, file://; .gz and other compressed JSONL by their
suffix). Nothing is downloaded from anywhere else.

A row's id is its `id`, `unique_id` or `task_id` column (the first the file has), else its 0-based
row number; ids are compared as text. The task is `math`, `gsm8k`, `humaneval` or `mcq`, inferred
from the columns when not given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from presto_ray.prompts import PromptFileError, parse_jsonl_lines
from presto_ray.tasks import mcq
from presto_ray.tasks.base import DatasetError, Problem
from presto_ray.tasks.registry import TASKS

ID_COLUMNS = ("id", "unique_id", "task_id")


def _open_source(source: str) -> tuple[Any, str]:
    """(pyarrow file system, path) of a local path or a URI."""
    import pyarrow as pa
    import pyarrow.fs as pafs

    if "://" in source:
        try:
            return pafs.FileSystem.from_uri(source)
        except (pa.ArrowException, OSError, ValueError) as e:
            raise DatasetError(f"{source}: cannot open ({e})") from None
    path = Path(source)
    if not path.exists():
        raise DatasetError(f"{source}: no such file")
    if path.is_dir():
        raise DatasetError(f"{source}: is a directory; give a JSONL or Parquet file")
    return pafs.LocalFileSystem(), str(path.resolve())


def read_rows(source: str) -> list[tuple[str, dict]]:
    """(where, row) for each row of a JSONL or Parquet file (`where` names the file and the row:
    'f.jsonl line 3', 'f.parquet row 2'); a DatasetError names a bad file or row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    fs, path = _open_source(source)
    name = path.rsplit("/", 1)[-1]
    if name.endswith((".parquet", ".pq")):
        try:
            table = pq.read_table(path, filesystem=fs)
        except (pa.ArrowException, OSError) as e:
            raise DatasetError(f"{source}: not a readable Parquet file ({str(e).splitlines()[0] if str(e) else e})") from None
        return [(f"{source} row {i}", row) for i, row in enumerate(table.to_pylist())]
    try:
        with fs.open_input_stream(path) as stream:  # compression from the suffix (.gz, .bz2, .zst)
            data = stream.read()
    except (pa.ArrowException, OSError) as e:
        raise DatasetError(f"{source}: cannot read ({e})") from None
    rows = []
    try:
        for lineno, row in parse_jsonl_lines(data.splitlines(), source):
            if not isinstance(row, dict):
                raise DatasetError(f"{source} line {lineno}: expected a JSON object, not {type(row).__name__}")
            rows.append((f"{source} line {lineno}", row))
    except PromptFileError as e:
        raise DatasetError(str(e)) from None
    return rows


def infer_task(columns: set[str], first: dict) -> str:
    """The task whose rows look like these (the columns of all rows, the first row)."""
    if {"prompt", "test", "entry_point"} <= columns:
        return "humaneval"
    if "problem" in columns and ({"answer", "solution"} & columns):
        return "math"
    if "question" in columns:
        if "choices" in columns or mcq.option_columns(columns):
            return "mcq"
        answer = first.get("answer")
        if isinstance(answer, str) and "####" in answer:
            return "gsm8k"
        if isinstance(answer, str) and answer.strip().strip("()").strip() in mcq.LETTERS and answer.strip():
            return "mcq"
    needs = "; ".join(f"{name}: {spec.needs}" for name, spec in TASKS.items())
    raise DatasetError(f"cannot tell the task from the columns {sorted(columns)}; give --task ({needs})")


@dataclass(frozen=True)
class Dataset:
    source: str
    task: str
    problems: list[Problem]
    id_column: str | None  # None: ids are row numbers
    rows: int  # rows in the file (problems may be the first --n of them)


def load_dataset(source: str, task: str | None = None, n: int | None = None) -> Dataset:
    """The problems of a dataset file (the first `n`, if given); DatasetError names what is wrong."""
    if task is not None and task not in TASKS:
        raise DatasetError(f"unknown task {task!r}; known: {', '.join(TASKS)}")
    if n is not None and n < 1:
        raise DatasetError("--n must be at least 1")
    rows = read_rows(source)
    if not rows:
        raise DatasetError(f"{source}: no rows")
    columns = set().union(*(row.keys() for _, row in rows))
    task = task or infer_task(columns, rows[0][1])
    id_column = next((c for c in ID_COLUMNS if c in columns), None)
    spec = TASKS[task]
    problems: list[Problem] = []
    seen: dict[str, str] = {}
    for i, (where, row) in enumerate(rows[:n] if n else rows):
        if id_column is None:
            problem_id = str(i)
        else:
            value = row.get(id_column)
            if value is None or isinstance(value, bool) or not isinstance(value, (str, int)) or str(value) == "":
                raise DatasetError(f"{where}: field '{id_column}' is missing, empty or not a string or integer")
            problem_id = str(value)
        if problem_id in seen:
            raise DatasetError(f"{where}: duplicate id {problem_id!r} (first at {seen[problem_id]})")
        seen[problem_id] = where
        problems.append(spec.from_row(row, problem_id, where))
    return Dataset(source, task, problems, id_column, len(rows))


@dataclass(frozen=True)
class Completion:
    id: str
    completion: str


def read_completions(source: str) -> list[Completion]:
    """Completion rows `{"id", "completion"}` (JSONL or Parquet); several rows of an id are several samples."""
    completions = []
    for where, row in read_rows(source):
        value = row.get("id")
        if value is None or isinstance(value, bool) or not isinstance(value, (str, int)) or str(value) == "":
            raise DatasetError(f"{where}: field 'id' is missing, empty or not a string or integer")
        text = row.get("completion")
        if not isinstance(text, str):
            raise DatasetError(f"{where}: field 'completion' must be a string" + (" (it is missing)" if text is None else ""))
        completions.append(Completion(str(value), text))
    if not completions:
        raise DatasetError(f"{source}: no completions")
    return completions
