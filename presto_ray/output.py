"""Parquet output of samples, written atomically (a temp file in the same folder, then rename)."""

from __future__ import annotations

import json
import os
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
    _stat("model_calls"),
    _stat("transitions"),
    _stat("accepted"),
    _stat("requests"),
    _stat("generated_tokens"),
    _stat("prompt_tokens"),
    _stat("cached_prompt_tokens"),
    _stat("wall_time_s", pa.float64()),
    Column("config", pa.string(), lambda s: s.config_json),
)
SAMPLE_SCHEMA = pa.schema([pa.field(c.name, c.type, nullable=c.nullable) for c in COLUMNS])


def sample_row(prompt_id: str, chain: int, seed: int, result: SampleResult, tokenizer: Tokenizer, config_json: str) -> dict:
    """One output row (a dict with the SAMPLE_SCHEMA columns): the sample, its text and statistics."""
    tokens = result.token_ids
    finished = FinishedSample(
        prompt_id, chain, seed, result, tokenizer.decode(tokens),
        bool(tokens) and tokens[-1] == tokenizer.eos_token_id, config_json,
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


class ShardedParquet:
    """A folder of Parquet shards (`part-<run>-<n>.parquet`), each written atomically.

    A crash loses at most the rows not yet flushed; `finished()` tells a rerun which
    (prompt_id, chain) pairs are already on disk. pyarrow and pandas read the folder as one table.
    """

    def __init__(self, directory: str | Path, shard_rows: int = 256, interval_s: float = 30.0) -> None:
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise ValueError(f"{self.directory} is a file; sharded output needs a folder")
        self.shard_rows, self.interval_s = shard_rows, interval_s
        self._run = f"{time.time_ns():x}"
        self._count = 0
        self._rows: list[dict] = []
        self._last_flush = time.monotonic()

    def shards(self) -> list[Path]:
        return _shards(self.directory)

    def finished(self, config_json: str) -> set[tuple[str, int]]:
        """The pairs already written; refuses shards written with another sampler config."""
        done: set[tuple[str, int]] = set()
        for shard in self.shards():
            table = pq.read_table(shard, columns=["prompt_id", "chain", "config"])
            if table.num_rows and set(table.column("config").to_pylist()) != {config_json}:
                raise ValueError(
                    f"{shard} holds samples drawn with another sampler configuration; "
                    "write to a new output folder or remove it"
                )
            done.update(zip(table.column("prompt_id").to_pylist(), table.column("chain").to_pylist()))
        return done

    def add(self, row: dict) -> None:
        self._rows.append(row)
        if len(self._rows) >= self.shard_rows or time.monotonic() - self._last_flush >= self.interval_s:
            self.flush()

    def flush(self) -> None:
        self._last_flush = time.monotonic()
        if not self._rows:
            return
        write_parquet_atomic(self._rows, self.directory / f"part-{self._run}-{self._count:05d}.parquet")
        self._count += 1
        self._rows = []


def _shards(directory: Path) -> list[Path]:
    return sorted(directory.glob("part-*.parquet")) if directory.is_dir() else []


def read_samples(path: str | Path) -> pa.Table:
    """A sample file or a folder of shards, as one table."""
    path = Path(path)
    if path.is_dir():
        shards = _shards(path)
        return pa.concat_tables([pq.read_table(s) for s in shards]) if shards else SAMPLE_SCHEMA.empty_table()
    return pq.read_table(path)
