"""Datasets from the user's files: JSONL and Parquet, paths and URIs, ids, --n, the inferred task, bad rows."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from presto_ray.tasks import DatasetError, load_dataset, read_completions
from presto_ray.tasks.datasets import infer_task

MATH = [
    {"problem": "1/2 + 0?", "answer": "\\frac12", "unique_id": "test/algebra/1.json"},
    {"problem": "2 + 2?", "solution": "It is $\\boxed{4}$.", "unique_id": "test/algebra/2.json"},
]
GSM8K = [{"question": "3 + 4?", "answer": "3 + 4 = 7\n#### 7"}, {"question": "10 - 1?", "answer": "#### 9"}]
HUMANEVAL = [{"task_id": "HumanEval/0", "prompt": "def f():\n", "test": "def check(c):\n    pass\n", "entry_point": "f"}]
MCQ = [{"id": 5, "question": "Pick", "choices": ["a", "b", "c", "d"], "answer": "B"}]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize(
    "rows, task", [(MATH, "math"), (GSM8K, "gsm8k"), (HUMANEVAL, "humaneval"), (MCQ, "mcq"),
                   ([{"question": "Q\nA) x\nB) y", "answer": "A"}], "mcq"),
                   ([{"question": "Q", "A": "x", "B": "y", "answer": "B"}], "mcq")],
)  # fmt: skip
def test_the_task_is_inferred_from_the_columns(tmp_path, rows, task):
    assert load_dataset(_jsonl(tmp_path / "d.jsonl", rows)).task == task


def test_ids_are_the_id_column_or_row_numbers_as_text(tmp_path):
    math = load_dataset(_jsonl(tmp_path / "m.jsonl", MATH))
    assert [p.id for p in math.problems] == ["test/algebra/1.json", "test/algebra/2.json"]
    assert [p.reference for p in math.problems] == ["\\frac12", "4"]
    assert [p.id for p in load_dataset(_jsonl(tmp_path / "g.jsonl", GSM8K)).problems] == ["0", "1"]
    assert load_dataset(_jsonl(tmp_path / "q.jsonl", MCQ)).problems[0].id == "5"
    assert [p.id for p in load_dataset(_jsonl(tmp_path / "g.jsonl", GSM8K), n=1).problems] == ["0"]


def test_parquet_gzip_and_uris(tmp_path):
    pq.write_table(pa.Table.from_pylist(GSM8K), tmp_path / "g.parquet")
    assert [p.reference for p in load_dataset(str(tmp_path / "g.parquet")).problems] == ["7", "9"]
    assert load_dataset(f"file://{tmp_path / 'g.parquet'}").task == "gsm8k"
    with gzip.open(tmp_path / "m.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in MATH))
    assert len(load_dataset(str(tmp_path / "m.jsonl.gz")).problems) == 2


def test_clear_errors(tmp_path):
    with pytest.raises(DatasetError, match=r"cannot tell the task from the columns \['colour', 'size'\]"):
        load_dataset(_jsonl(tmp_path / "x.jsonl", [{"colour": "red", "size": 1}]))
    with pytest.raises(DatasetError, match="no such file"):
        load_dataset(str(tmp_path / "missing.jsonl"))
    bad = _jsonl(tmp_path / "bad.jsonl", [GSM8K[0], {"question": "Q", "answer": "no number"}])
    with pytest.raises(DatasetError, match=r"bad.jsonl line 2: field 'answer' must end with '#### <number>'"):
        load_dataset(bad)
    with pytest.raises(DatasetError, match="line 2: duplicate id"):
        load_dataset(_jsonl(tmp_path / "dup.jsonl", [MCQ[0], MCQ[0]]))
    with pytest.raises(DatasetError, match="line 1: field 'prompt' is missing"):
        load_dataset(_jsonl(tmp_path / "h.jsonl", [{**HUMANEVAL[0], "prompt": ""}]), task="humaneval")
    (tmp_path / "broken.jsonl").write_text('{"question": \n')
    with pytest.raises(DatasetError, match="broken.jsonl line 1: invalid JSON"):
        load_dataset(str(tmp_path / "broken.jsonl"))
    with pytest.raises(DatasetError, match="unknown task"):
        load_dataset(bad, task="chess")
    assert infer_task({"problem", "solution"}, {}) == "math"


def test_completions(tmp_path):
    rows = [{"id": 0, "completion": "#### 7"}, {"id": "0", "completion": ""}]
    assert [(c.id, c.completion) for c in read_completions(_jsonl(tmp_path / "c.jsonl", rows))] == [("0", "#### 7"), ("0", "")]
    with pytest.raises(DatasetError, match="c2.jsonl line 1: field 'completion' must be a string"):
        read_completions(_jsonl(tmp_path / "c2.jsonl", [{"id": 1, "text": "x"}]))
    with pytest.raises(DatasetError, match="line 1: field 'id' is missing"):
        read_completions(_jsonl(tmp_path / "c3.jsonl", [{"completion": "x"}]))
