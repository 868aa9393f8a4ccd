"""What every `presto-ray` command shares: messages and exit statuses, the job config with its
command-line overrides, the comma-separated integers of list flags, the Ray options.

Light on purpose (argparse and pydantic): the parser is built from these before any command runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeAlias

from pydantic import ValidationError

if TYPE_CHECKING:
    from presto_ray.job import JobConfig

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples" / "prompts.jsonl"

OK = 0
FAILED = 1  # the work failed (not the user's input): a job failure, a load test that did not pass
BAD_INPUT = 2  # the user's input: a flag, a config, a prompt file (argparse's own status too)

Handler = Callable[[argparse.Namespace], int]
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"  # what add_subparsers returns


def fail(message: str) -> int:
    """Print `presto-ray: error: message` to stderr; the bad-input exit status."""
    print(f"presto-ray: error: {message}", file=sys.stderr)
    return BAD_INPUT


def progress(message: str) -> None:
    """A progress line on stderr (stdout carries the report)."""
    print(message, file=sys.stderr, flush=True)


class BadInput(Exception):
    """A message for the user (exit status 2)."""


def watch_engine_processes(config: JobConfig) -> None:
    """vLLM's EngineCore and worker processes outlive a SIGKILLed driver (measured: 3 processes,
    8.1 GB RSS left): before an in-process vLLM engine starts, a watchdog
    (presto_ray/process_watchdog.py) starts recording this driver's process tree and stops what
    is left of it once the driver is gone; what a killed driver and watchdog left is stopped
    here, by the next run (and said on stderr). Called by every command that starts vLLM in
    process (sample, validate, eval); on Ray the local-Ray watchdog covers the replicas."""
    if config.engine.kind != "vllm":
        return  # the toy engine starts no process
    from presto_ray import process_watchdog

    records = process_watchdog.records_folder("engine")
    process_watchdog.reap_left_behind(records, "engine")
    process_watchdog.start_watchdog(records)


def validation_message(error: ValidationError, source: str) -> str:
    """`source: invalid configuration: field: message; ...`, naming a cross-field rule's field."""
    from presto_ray.config import error_text

    parts = []
    for e in error.errors():
        field = ".".join(str(p) for p in e["loc"])
        named = getattr((e.get("ctx") or {}).get("error"), "field", None)  # a cross-field rule's field
        if named:
            field = f"{field}.{named}" if field else named
        parts.append(f"{field or '(root)'}: {error_text(e)}")
    return f"{source}: invalid configuration: " + "; ".join(parts)


def load_job_config(args: argparse.Namespace) -> JobConfig:
    """The job config from --config plus command-line overrides (--chains, --seed, --host, --port,
    where the command has them); BadInput names what is wrong."""
    from presto_ray.job import ConfigFileError, JobConfig

    source = args.config or "default configuration"
    try:
        config = JobConfig.from_yaml(args.config) if args.config else JobConfig()
        overrides: dict[str, Any] = {}
        if getattr(args, "chains", None) is not None:
            overrides["chains_per_prompt"] = args.chains
        if getattr(args, "seed", None) is not None:
            overrides["sampler"] = {**config.sampler.model_dump(), "seed": args.seed}
        serve = {k: getattr(args, k) for k in ("host", "port") if getattr(args, k, None) is not None}
        if serve:
            overrides["serve"] = {**config.serve.model_dump(), **serve}
        if overrides:
            source += " with command-line overrides"
            config = JobConfig.model_validate({**config.model_dump(), **overrides})
    except ValidationError as e:
        raise BadInput(validation_message(e, source)) from None
    except ConfigFileError as e:  # names the file itself
        raise BadInput(str(e)) from None
    except (OSError, ValueError) as e:
        raise BadInput(f"{args.config}: {e}") from None
    return config


def comma_ints(text: str, *, invalid: str, below_one: str | None = None) -> tuple[int, ...]:
    """The integers of a comma-separated flag value ("8,16,32"), the one parser of every list flag.

    BadInput(invalid) if a part is not an integer (`invalid` may name the value as `{text!r}`);
    BadInput(below_one) if `below_one` is given and a number is below 1."""
    try:
        numbers = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise BadInput(invalid.format(text=text)) from None
    if below_one is not None and any(n < 1 for n in numbers):
        raise BadInput(below_one)
    return numbers


def add_ray_options(parser: argparse.ArgumentParser, ray_help: str | None) -> None:
    """`--address` (and `--ray` with `ray_help`; None: the command always runs on Ray)."""
    if ray_help is not None:
        parser.add_argument("--ray", action="store_true", help=ray_help)
    parser.add_argument("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS, else a local Ray)")
