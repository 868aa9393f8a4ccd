"""The `presto-ray` command line: `sample` (the main job), `validate`, `eval`, `grade`, `model`, `serve` and the
benchmarks. The one composition root of the library: its command modules import the layers above
(`deployments`, `actors`, `bench`) only inside the commands that need them, and nothing imports
the command line back (an import-linter contract).

    __init__   main, the parser assembled from each module's COMMANDS
    common     messages and exit statuses, the job config with overrides, comma-separated integers
    sample     sample (in process; --ray on Ray Data: deployments/data_job.py)
    check      validate and eval (in process, or --ray: actors/ray_backend.py)
    grade      grade (completions made anywhere, against a benchmark dataset: presto_ray/tasks/)
    model      model (the packaged SmolLM2)
    serve      serve (Ray Serve: deployments/serve_app.py)
    bench_*    the benchmark commands, each importing its benchmark from bench/ when it runs:
               bench_toy (bench), bench_real (bench-real; its load bench bench_real_load, its
               --config engine bench_real_engine), bench_ray (bench-ray, bench-coordinator,
               load-test), bench_early_rejection, and what they share, bench_common
"""

from __future__ import annotations

import argparse
from typing import Callable

from presto_ray.cli import (  # light: each benchmark command imports its benchmark when it runs
    bench_early_rejection,
    bench_ray,
    bench_real,
    bench_toy,
    check,
    grade,
    model,
    sample,
    serve,
)
from presto_ray.cli.common import Subparsers

# the subcommands in the order `presto-ray --help` lists them
ORDER = ("sample", "model", "bench", "bench-real", "serve", "validate", "eval", "grade", "load-test", "bench-ray", "bench-coordinator", "bench-early-rejection")


def _registrars() -> dict[str, Callable[[Subparsers], None]]:
    modules = (sample, model, serve, check, grade, bench_toy, bench_real, bench_ray, bench_early_rejection)
    return {name: add for module in modules for name, add in module.COMMANDS.items()}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="presto-ray", description="Exact power sampling with PreSTO prefetching.")
    sub = parser.add_subparsers(dest="command", required=True)
    registrars = _registrars()
    assert set(registrars) == set(ORDER), sorted(set(registrars) ^ set(ORDER))
    for name in ORDER:
        registrars[name](sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


__all__ = ["build_parser", "main"]
