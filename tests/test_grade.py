"""`presto-ray grade`: completions made anywhere, graded against a dataset file."""

from __future__ import annotations

import json

import pytest

from presto_ray.cli import main

GSM8K = [{"question": "3 + 4?", "answer": "#### 7"}, {"question": "10 - 1?", "answer": "#### 9"}]
HUMANEVAL = [{"task_id": "t/0", "prompt": "def inc(x):\n", "entry_point": "inc",
              "test": "def check(candidate):\n    assert candidate(1) == 2\n"}]  # fmt: skip


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_grade_gsm8k_with_several_samples(tmp_path, capsys):
    dataset = _jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    completions = _jsonl(tmp_path / "c.jsonl", [
        {"id": 0, "completion": "3 + 4 = 7\n#### 7"}, {"id": "0", "completion": "#### 8"},
        {"id": 1, "completion": "it is 9"}, {"id": 1, "completion": "1,000"},
    ])  # fmt: skip
    out = tmp_path / "new" / "folder" / "report.json"  # the parent folders are created
    assert main(["grade", "--dataset", dataset, "--completions", completions, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["task"] == "gsm8k" and report["accuracy"] == 0.5
    assert report["pass_at_k"] == {"1": 0.5, "2": 1.0}
    assert [(r["id"], r["sample"], r["correct"]) for r in report["rows"]] == [("0", 0, True), ("0", 1, False), ("1", 0, True), ("1", 1, False)]
    assert [r["extracted"] for r in report["rows"]] == ["7", "8", "9", "1000"]
    printed = capsys.readouterr().out
    assert "accuracy 50.0%" in printed and "pass@2 100.0%" in printed and f"wrote {out}" in printed
    assert not list(out.parent.glob(".*.tmp"))  # the atomic write left no temp file


def test_grade_humaneval_and_math(tmp_path):
    dataset = _jsonl(tmp_path / "he.jsonl", HUMANEVAL)
    completions = _jsonl(tmp_path / "c.jsonl", [{"id": "t/0", "completion": "    return x + 1\n"},
                                               {"id": "t/0", "completion": "    while True: pass\n"}])  # fmt: skip
    out = tmp_path / "he.json"
    assert main(["grade", "--dataset", dataset, "--completions", completions, "--out", str(out), "--timeout", "2"]) == 0
    report = json.loads(out.read_text())
    assert [r["status"] for r in report["rows"]] == ["passed", "timeout"] and report["pass_at_k"]["1"] == 0.5
    math = _jsonl(tmp_path / "math.jsonl", [{"problem": "half?", "answer": "\\frac{1}{2}", "unique_id": "m1"}])
    completions = _jsonl(tmp_path / "mc.jsonl", [{"id": "m1", "completion": "so $\\boxed{0.5}$"}])
    assert main(["grade", "--dataset", math, "--completions", completions, "--out", str(out), "--task", "math"]) == 0
    assert json.loads(out.read_text())["accuracy"] == 1.0


def test_unknown_ids_and_bad_input_are_exit_2(tmp_path, capsys):
    dataset = _jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    out = tmp_path / "r.json"
    completions = _jsonl(tmp_path / "c.jsonl", [{"id": 0, "completion": "7"}, {"id": "x9", "completion": "7"}])
    assert main(["grade", "--dataset", dataset, "--completions", completions, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "completions for ids not in" in err and "'x9'" in err and "row numbers" in err
    one = _jsonl(tmp_path / "c1.jsonl", [{"id": 1, "completion": "9"}])
    assert main(["grade", "--dataset", dataset, "--completions", one, "--out", str(out), "--n", "1"]) == 2
    assert "not in the first 1 problems" in capsys.readouterr().err
    assert not out.exists()
    bad = _jsonl(tmp_path / "bad.jsonl", [{"colour": "red"}])
    assert main(["grade", "--dataset", bad, "--completions", one, "--out", str(out)]) == 2
    assert "cannot tell the task from the columns ['colour']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["grade", "--dataset", dataset, "--completions", one, "--out", str(out), "--task", "chess"])


def test_an_out_that_would_replace_an_input_is_refused(tmp_path, capsys, monkeypatch):
    dataset = _jsonl(tmp_path / "he.jsonl", HUMANEVAL)
    completions = _jsonl(tmp_path / "c.jsonl", [{"id": "t/0", "completion": "    return x + 1\n"}])
    before = {path: open(path).read() for path in (dataset, completions)}
    monkeypatch.chdir(tmp_path)
    for out, flag in ((completions, "--completions"), (dataset, "--dataset"), ("c.jsonl", "--completions")):  # also by another name
        assert main(["grade", "--dataset", dataset, "--completions", completions, "--out", out]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--out {out} is {flag}" in err[0] and "would replace it" in err[0], err
    assert main(["eval", "--dataset", dataset, "--out", dataset]) == 2  # refused before any config or model
    assert "--out " + dataset + " is --dataset" in capsys.readouterr().err
    assert {path: open(path).read() for path in (dataset, completions)} == before


def test_memory_mb_too_small_is_refused(tmp_path, capsys):
    dataset = _jsonl(tmp_path / "he.jsonl", HUMANEVAL)
    completions = _jsonl(tmp_path / "c.jsonl", [{"id": "t/0", "completion": "    return x + 1\n"}])
    out = tmp_path / "r.json"
    for value in ("0", "-5", "63"):
        assert main(["grade", "--dataset", dataset, "--completions", completions, "--out", str(out), "--memory-mb", value]) == 2
        assert f"--memory-mb must be at least 64 (MiB of address space per sample), not {value}" in capsys.readouterr().err
    assert not out.exists()
    assert main(["grade", "--dataset", dataset, "--completions", completions, "--out", str(out), "--memory-mb", "64"]) == 0
    assert json.loads(out.read_text())["accuracy"] == 1.0  # the smallest allowed still runs a sample
