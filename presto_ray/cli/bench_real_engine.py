"""bench-real on a job config's engine (--config, and the load bench's --chains): the prompts
checked and the engine started as `presto-ray sample` does, the bench run on it, the engine
stopped, the machine's line and the verdict (exit 1 where a run's samples differ from serial's)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from presto_ray.cli.common import FAILED, OK, BadInput, fail

if TYPE_CHECKING:
    from collections.abc import Callable

    from presto_ray.engines.base import Engine
    from presto_ray.job import JobConfig


# with --config the engine is the config's: the one-chain bench and the load bench both refuse --logp0-from
LOGP0_WITH_CONFIG = "--logp0-from is the default vLLM engine's; with --config set engine.logp0_from in the config"


def check_prompts(args: argparse.Namespace) -> None:
    """BadInput where --prompts cannot be read or holds no prompts (with --n: among the first N)."""
    from presto_ray.prompts import PromptFileError, read_prompts

    try:
        if not read_prompts(args.prompts)[: args.n]:
            raise BadInput(f"--prompts {args.prompts}: no prompts")
    except PromptFileError as e:
        raise BadInput(str(e)) from None


def _start_engine(args: argparse.Namespace, config: JobConfig, source: str) -> Engine:
    """The engine `config.engine` builds, as `presto-ray sample` builds it (its logs quiet unless
    --verbose, vLLM's processes watched); BadInput naming `source` where it cannot be built."""
    from presto_ray.cli.common import watch_engine_processes
    from presto_ray.cli.sample import quiet_engine_logs
    from presto_ray.engines import build_engine

    if not args.verbose:
        quiet_engine_logs()
    watch_engine_processes(config)
    try:
        return build_engine(config.engine)
    except (RuntimeError, ValueError, OSError, ImportError) as e:  # ModelProvisionError is a RuntimeError
        reason = " ".join(str(e).split()) or type(e).__name__  # one line: transformers' errors span several
        raise BadInput(f"{source}: cannot build its {config.engine.kind} engine: {reason}") from None


def on_engine(
    args: argparse.Namespace, config: JobConfig, source: str, out: str, png: str,
    run: Callable[[Engine], dict], *texts: Callable[[dict], str],
) -> int:
    """Start `config`'s engine, `run` the bench on it, stop it; print the report's `texts`, the
    machine's line and the verdict (exit 2 where the engine cannot start or a prompt is refused)."""
    try:
        engine = _start_engine(args, config, source)
    except BadInput as e:
        return fail(str(e))
    try:
        report = run(engine)
    except ValueError as e:  # e.g. a prompt longer than the engine's context
        return fail(str(e))
    finally:
        engine.shutdown()
    for text in texts:
        print(text(report))
    return _machine_and_verdict(report, out, png)


def _machine_and_verdict(report: dict, out: str, png: str) -> int:
    """The machine's line and what was written; exit 1 where a run's samples differ from serial's."""
    import sys

    machine = report["machine"]
    print(
        f"bench wall clock {machine['bench_wall_time_s']:.1f} s (engine start {report['config']['engine_startup_s']:.1f} s "
        f"before it), load average {machine['load_average_start'][0]:.2f} at the start, "
        f"{machine['load_average_end'][0]:.2f} at the end ({machine['cpu_count']} CPUs)"
    )
    print(f"wrote {out}" + (f" and {png}" if Path(png).exists() else ""))
    if not report["samples_check"]["all_same"]:
        print("presto-ray: error: a run's samples differ from serial's", file=sys.stderr)
        return FAILED
    return OK
