"""Output rows are built from a SampleResult next to the Parquet schema: the two cannot drift."""

from dataclasses import fields

import pyarrow as pa
import pyarrow.parquet as pq

from presto_ray import SamplerConfig
from presto_ray.driver import sample
from presto_ray.engines import ToyEngineConfig
from presto_ray.output import COLUMNS, SAMPLE_SCHEMA, read_samples, sample_row, write_parquet_atomic
from presto_ray.results import SampleStats


def _rows():
    engine = ToyEngineConfig(vocab_size=32).build()
    config = SamplerConfig(block_size=8, mh_steps=4, prefetch_budget=4, seed=3)
    rows = []
    for chain in range(3):
        result = sample(engine, [4, 5, 6 + chain], config.model_copy(update={"seed": chain}))
        rows.append(sample_row("p", chain, chain, result, engine.tokenizer, config.model_dump_json()))
    return rows, result


def test_rows_have_exactly_the_schema_columns_and_types(tmp_path):
    rows, _ = _rows()
    assert all(list(row) == SAMPLE_SCHEMA.names for row in rows)
    table = pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA)  # raises on a value of the wrong type
    write_parquet_atomic(rows, tmp_path / "s.parquet")
    assert pq.read_schema(tmp_path / "s.parquet").names == SAMPLE_SCHEMA.names
    assert read_samples(tmp_path / "s.parquet").to_pylist() == table.to_pylist()


def test_statistics_columns_are_the_chains_own_figures():
    rows, result = _rows()
    stat_names = {f.name for f in fields(SampleStats)}
    stat_columns = [c.name for c in COLUMNS if c.name in stat_names]
    assert {"rounds", "stream_batches"} <= set(stat_columns) and "cached_prompt_tokens" in stat_columns
    for name in stat_columns:
        assert rows[-1][name] == getattr(result.stats, name)
    assert rows[-1]["token_ids"] == list(result.token_ids)
    assert result.stats.prompt_tokens > 0
    assert (result.stats.rounds > 0) != (result.stats.stream_batches > 0), "each schedule counts its own figure"


# --- one live writer per output folder (issue 15 item 4) ------------------------------------------
def test_a_second_live_writer_is_refused_and_a_dead_ones_lock_is_taken_over(tmp_path):
    import json
    import os
    import socket
    import subprocess
    import sys

    import pytest

    from presto_ray.output import OutputLock

    first, second = OutputLock(tmp_path / "out"), OutputLock(tmp_path / "out")
    first.acquire()
    owner = json.loads(first.path.read_text())
    assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
    with pytest.raises(ValueError, match=f"being written by process {os.getpid()} on {socket.gethostname()}"):
        second.acquire()
    first.release()
    assert not first.path.exists()
    second.acquire()  # free again
    second.release()

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    first.path.write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname()}))
    second.acquire()  # that writer died (killed, crashed): its lock is stale
    assert json.loads(second.path.read_text())["pid"] == os.getpid()
    second.release()

    first.path.write_text(json.dumps({"pid": 1, "host": "another-node"}))  # cannot be checked from here
    with pytest.raises(ValueError, match="another-node.*remove the lock file"):
        second.acquire()
