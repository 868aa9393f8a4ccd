"""Output rows are built from a SampleResult next to the Parquet schema: the two cannot drift."""

from dataclasses import fields
from pathlib import Path

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


# --- where the job may write (issue "Nothing lost, nothing twice, no traceback", items 1 and 2) ---
def test_an_output_that_is_the_input_or_not_ours_or_unwritable_is_refused(tmp_path):
    """Checked before any sampling: the prompts are never replaced, nor a stranger's file, and a
    path where no file can be created fails now, not after the run."""
    import pytest

    from presto_ray.output import OutputPathError, check_output_file, check_output_folder, is_sample_file

    prompts = tmp_path / "good.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n')
    link = tmp_path / "link.jsonl"
    link.symlink_to(prompts)
    folder = tmp_path / "a_folder"
    folder.mkdir()
    stranger = tmp_path / "theirs.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), stranger)
    refused = {
        prompts: "is the prompt file",
        link: "is the prompt file",
        folder: "is a directory",
        stranger: "is not a presto-ray sample file",
        Path("/proc/x.parquet"): "cannot write there",
    }
    for out, message in refused.items():
        with pytest.raises(OutputPathError, match=message):
            check_output_file(out, prompts)
    assert prompts.read_text() == '{"id": "a", "prompt": "hi"}\n' and stranger.exists()

    ours = tmp_path / "ours.parquet"
    rows, _ = _rows()
    write_parquet_atomic(rows, ours)
    assert is_sample_file(ours) and not is_sample_file(stranger) and not is_sample_file(prompts)
    check_output_file(ours, prompts)  # our own earlier output may be replaced
    check_output_file(tmp_path / "new" / "nested" / "s.parquet", prompts)  # created as needed
    old_style = tmp_path / "old.parquet"  # written before the schema carried our mark
    pq.write_table(pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA.remove_metadata()), old_style)
    assert is_sample_file(old_style)

    # the Ray job's folder: not the prompts, not holding or inside them, not a file, not a stranger's
    parquet_prompts = tmp_path / "in"
    parquet_prompts.mkdir()
    pq.write_table(pa.table({"id": ["a"], "prompt": ["hi"]}), parquet_prompts / "part-0.parquet")
    folders = {
        parquet_prompts: "is the prompt file",
        parquet_prompts / "out": "lies inside the prompts",
        tmp_path: "holds the prompts",
        ours: "is a file",
        folder.parent / "busy": "folder of other files",
        Path("/proc/dir"): "cannot write there",
    }
    (folder.parent / "busy").mkdir()
    (folder.parent / "busy" / "notes.txt").write_text("mine")
    for out, message in folders.items():
        with pytest.raises(OutputPathError, match=message):
            check_output_folder(out, str(parquet_prompts), ".presto-ray-job.json")
    check_output_folder(tmp_path / "fresh", str(parquet_prompts), ".presto-ray-job.json")
    (folder.parent / "busy" / ".presto-ray-job.json").write_text("{}")  # a folder of ours: resumable
    check_output_folder(folder.parent / "busy", str(parquet_prompts), ".presto-ray-job.json")
