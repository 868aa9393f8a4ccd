"""Parquet output of samples, written atomically (a temp file in the same folder, then rename)."""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

SAMPLE_SCHEMA = pa.schema(
    [
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("chain", pa.int32(), nullable=False),
        pa.field("seed", pa.int64(), nullable=False),
        pa.field("text", pa.string()),
        pa.field("token_ids", pa.list_(pa.int32())),
        pa.field("finished_with_eos", pa.bool_()),
        pa.field("model_calls", pa.int64()),
        pa.field("transitions", pa.int64()),
        pa.field("accepted", pa.int64()),
        pa.field("requests", pa.int64()),
        pa.field("generated_tokens", pa.int64()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("cached_prompt_tokens", pa.int64()),
        pa.field("wall_time_s", pa.float64()),
        pa.field("config", pa.string()),  # the SamplerConfig as JSON
    ]
)


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


def write_json_atomic(data: dict, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n")
