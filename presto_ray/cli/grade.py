"""`presto-ray grade`: grade completions made anywhere against a benchmark dataset (presto_ray/tasks/)."""

from __future__ import annotations

import argparse
import os
from collections import Counter
from pathlib import Path

from presto_ray.cli.common import OK, Subparsers, fail, progress


def out_replaces_input(out: str, **inputs: str | None) -> str | None:
    """Why writing the report to `out` would replace one of the inputs (`--flag` = path), or None: the
    batch job's check (presto_ray.output: the same file, a folder holding it, a file inside it)."""
    from presto_ray.output import _overlap

    for flag, path in inputs.items():
        if path and "://" not in path and "://" not in out and (how := _overlap(Path(out), Path(path))):
            relation = {"is": "is", "holds": "holds", "lies": "lies inside"}[how.split()[0]]
            return f"--out {out} {relation} --{flag} {path}: the report would replace it; write it to another file"
    return None


def cmd_grade(args: argparse.Namespace) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from presto_ray.output import write_json_atomic
    from presto_ray.tasks import DatasetError, Limits, grade, load_dataset, read_completions
    from presto_ray.tasks.sandbox import MIN_MEMORY_MB, describe_sandbox
    from presto_ray.tasks.report import GradedSample, grade_report, shown_ks

    if args.timeout <= 0:
        return fail("--timeout must be positive")
    if args.memory_mb < MIN_MEMORY_MB:
        return fail(f"--memory-mb must be at least {MIN_MEMORY_MB} (MiB of address space per sample), not {args.memory_mb}")
    if args.jobs is not None and args.jobs < 1:
        return fail("--jobs must be at least 1")
    if clash := out_replaces_input(args.out, completions=args.completions, dataset=args.dataset):
        return fail(clash)
    try:
        dataset = load_dataset(args.dataset, args.task, args.n)
        completions = read_completions(args.completions)
    except DatasetError as e:
        return fail(str(e))
    problems = {p.id: p for p in dataset.problems}
    unknown = sorted({c.id for c in completions} - set(problems))
    if unknown:
        where = f"the first {args.n} problems of {args.dataset}" if args.n else args.dataset
        shown = ", ".join(repr(u) for u in unknown[:10]) + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
        return fail(f"{args.completions}: completions for ids not in {where}: {shown}"
                    + ("" if dataset.id_column else " (the dataset has no id column: its ids are row numbers 0, 1, ...)"))
    index: Counter[str] = Counter()
    samples = []
    for c in completions:
        samples.append((c, index[c.id]))
        index[c.id] += 1
    limits = Limits(timeout_s=args.timeout, memory_mb=args.memory_mb)
    progress(f"grading {len(completions)} completions of {len(index)} {dataset.task} problems")
    if dataset.task == "humaneval":
        progress(f"sandbox: {describe_sandbox(limits)}")

    def one(item: tuple) -> GradedSample:
        c, k = item
        return GradedSample(c.id, k, grade(problems[c.id], c.completion, limits))

    if dataset.task == "humaneval":  # subprocesses: in parallel (math-verify's timeouts need the main thread)
        with ThreadPoolExecutor(args.jobs or os.cpu_count() or 1) as pool:
            graded = list(pool.map(one, samples))
    else:
        graded = [one(item) for item in samples]
    report = {
        "task": dataset.task,
        "dataset": args.dataset,
        "completions": args.completions,
        **grade_report(graded, [p.id for p in dataset.problems]),
    }
    write_json_atomic(report, args.out)
    per = report["samples_per_problem"]
    spread = f"{per['min']}" if per["min"] == per["max"] else f"{per['min']}-{per['max']}"
    print(f"{dataset.task}: {report['problems']} problems, {report['samples']} completions ({spread} per problem)"
          + (f"; {report['problems_without_completions']} problems have none" if report["problems_without_completions"] else ""))
    ci = f" (95% CI {report['ci_low']:.1%}-{report['ci_high']:.1%})" if report["ci_low"] is not None else ""
    print(f"accuracy {report['accuracy']:.1%}{ci}: {report['correct']} of {report['samples']} correct")
    if report["pass_at_k"]:
        print("  ".join(f"pass@{k} {report['pass_at_k'][str(k)]:.1%}" for k in shown_ks(report["pass_at_k"])))
    print("statuses: " + ", ".join(f"{s} {n}" for s, n in report["statuses"].items()))
    print(f"wrote {args.out}")
    return OK


def add_grade(sub: Subparsers) -> None:
    g = sub.add_parser(
        "grade", help="grade completions (JSONL rows id, completion) against a MATH, GSM8K, HumanEval or multiple-choice dataset",
    )  # fmt: skip
    g.add_argument("--dataset", required=True, help="the benchmark's rows: JSONL or Parquet, a path or a URI pyarrow reads")
    g.add_argument("--completions", required=True, help="JSONL (or Parquet) rows {id, completion}; several rows per id are several samples")
    g.add_argument("--out", required=True, help="JSON report (accuracy, pass_at_k, rows)")
    g.add_argument("--task", default=None, choices=("math", "gsm8k", "humaneval", "mcq"), help="default: inferred from the columns")
    g.add_argument("--n", type=int, default=None, help="only the first N problems")
    g.add_argument("--timeout", type=float, default=5.0, help="humaneval: seconds per sample (default 5)")
    g.add_argument("--memory-mb", type=int, default=1024, help="humaneval: address space per sample (default 1024 MiB)")
    g.add_argument("--jobs", type=int, default=None, help="humaneval: samples run at once (default: the CPUs)")
    g.set_defaults(func=cmd_grade)


COMMANDS = {"grade": add_grade}
