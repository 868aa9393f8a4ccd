"""The Ray Data job's snapshot of its input and its output folder's own files (issue 34, items 2
and 3), on real files and a real full tmpfs, without Ray: the job reads a copy whose every row's
id was checked as it was copied, later writes to the input reach neither, and a full disk under
the output is one OutputPathError that leaves no partial file (snapshot, lock, job record, a cut
data file). The jobs themselves: tests/test_ray_data.py."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from tmpfs import fill, small_tmpfs, tmp_files

pytest.importorskip("ray.data")

from deployments.job_folder import CHECKPOINT_DIR, JOB_RECORD, check_job_record, discard_uncommitted  # noqa: E402
from deployments.job_input import SNAPSHOTS, InputSnapshot, prompt_input  # noqa: E402
from presto_ray.output import OutputLock, OutputPathError  # noqa: E402
from presto_ray.prompts import PromptFileError  # noqa: E402

LOCAL = pafs.LocalFileSystem()


def jsonl(path: Path, ids) -> Path:
    path.write_text("".join(json.dumps({"id": i, "prompt": f"question {i}?"}) + "\n" for i in ids))
    return path


def snapshot_of(prompts: Path, out: Path) -> InputSnapshot:
    out.mkdir(exist_ok=True)
    return InputSnapshot(prompt_input(str(prompts)), str(out), LOCAL, str(out), "id")


def test_a_jsonl_snapshot_holds_the_lines_checked_and_nothing_written_after(tmp_path):
    prompts = jsonl(tmp_path / "p.jsonl", ["a", "b", "c"])
    original = prompts.read_bytes()
    snap = snapshot_of(prompts, tmp_path / "out")
    copy = Path(snap.input.path)
    assert snap.rows == 3 and copy.read_bytes() == original and copy.parent.parent.name == SNAPSHOTS
    assert not snap.changed()
    with prompts.open("a") as f:  # what the probe did mid-run: more rows, one of an id already there, a broken line
        f.write(json.dumps({"id": "b", "prompt": "again"}) + "\n" + '{"id": "zz", "prompt": \n')
    assert copy.read_bytes() == original and snap.changed()
    snap.remove()
    assert not copy.parent.exists() and not (tmp_path / "out" / SNAPSHOTS).exists()


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n', "duplicate 'id' values: ['a']"),
        ('{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": \n', "line 2: invalid JSON"),
        ('{"id": "a", "prompt": "x", "id": "b"}\n', "line 1: the key 'id' appears more than once"),
        ('{"prompt": "x"}\n', "line 1: field 'id' is missing or empty"),
    ],
)
def test_a_bad_input_is_refused_naming_the_users_file_and_leaves_no_copy(tmp_path, content, message):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(content)
    with pytest.raises(PromptFileError, match=f"^{prompts}") as caught:
        snapshot_of(prompts, tmp_path / "out")
    assert message in str(caught.value)
    assert not list((tmp_path / "out" / SNAPSHOTS).rglob("*.jsonl"))


def test_a_parquet_folder_is_copied_file_by_file_and_checked_on_the_copy(tmp_path):
    folder = tmp_path / "prompts"
    (folder / "part=1").mkdir(parents=True)
    pq.write_table(pa.table({"id": ["a", "b"], "prompt": ["x", "y"]}), folder / "one.parquet")
    pq.write_table(pa.table({"id": ["c"], "prompt": ["z"]}), folder / "part=1" / "two.parquet")
    (folder / "_SUCCESS").write_text("")  # skipped, as pyarrow's dataset skips it
    snap = snapshot_of(folder, tmp_path / "out")
    copied = sorted(str(p.relative_to(snap.input.path)) for p in Path(snap.input.path).rglob("*") if p.is_file())
    assert snap.rows == 3 and copied == ["one.parquet", "part=1/two.parquet"]
    pq.write_table(pa.table({"id": ["a"], "prompt": ["dup"]}), folder / "three.parquet")  # a file added mid-run
    assert snap.changed() and len(snap.input.files()) == 2
    snap.remove()
    pq.write_table(pa.table({"id": ["a", "b"], "prompt": ["x", "y"]}), folder / "three.parquet")
    with pytest.raises(PromptFileError, match=rf"^{folder}: duplicate 'id' values: \['a', 'b'\]"):
        snapshot_of(folder, tmp_path / "out2")


def test_on_a_full_disk_the_snapshot_lock_and_job_record_fail_in_one_line_leaving_nothing(tmp_path):
    prompts = jsonl(tmp_path / "p.jsonl", range(2000))  # ~60 kB: more than the disk holds once half full
    with small_tmpfs(tmp_path / "disk") as disk:
        (disk / "half").write_bytes(b"\0" * 60_000)
        with pytest.raises(OutputPathError, match=rf"^--out {disk}: cannot write the input's snapshot there \(No space left on device\)$"):
            snapshot_of(prompts, disk)
        assert not list((disk / SNAPSHOTS).rglob("*.jsonl")) and tmp_files(disk) == []
        fill(disk)
        with pytest.raises(OutputPathError, match=rf"^--out {disk}: cannot write there \(No space left on device\)$"):
            OutputLock(disk).acquire()
        assert not (disk / OutputLock.NAME).exists()
        with pytest.raises(OutputPathError, match=rf"cannot write the job record {JOB_RECORD} \(No space left on device\)$"):
            check_job_record(LOCAL, str(disk), {"sampler": {"alpha": 4.0}, "chains_per_prompt": 2})
        assert not (disk / JOB_RECORD).exists() and tmp_files(disk) == []


def test_a_failed_write_leaves_only_committed_whole_files(tmp_path):
    """Ray Data's two-phase commit: a pending checkpoint, the data file, the commit. What a write
    cut short left (a data file beside its pending checkpoint) goes, as the next run's read would
    remove it; committed files stay."""
    out = tmp_path / "out"
    (out / CHECKPOINT_DIR).mkdir(parents=True)
    pq.write_table(pa.table({"input_key": ["a#1"]}), out / CHECKPOINT_DIR / "run_000000.parquet")
    pq.write_table(pa.table({"x": [1]}), out / "run_000000-0.parquet")
    pq.write_table(pa.table({"input_key": ["b#2"]}), out / CHECKPOINT_DIR / "run_000001.pending.parquet")
    (out / "run_000001-0.parquet").write_bytes(b"PAR1 cut short")
    assert discard_uncommitted(LOCAL, str(out), quiet_s=0.05) == 1
    assert sorted(p.name for p in out.rglob("*.parquet")) == ["run_000000-0.parquet", "run_000000.parquet"]
    assert pq.read_table(out).num_rows == 1
