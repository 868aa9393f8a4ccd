"""`presto-ray sample`: the main job, in process (presto_ray/job.py) or on Ray Data (`--ray`:
deployments/data_job.py, imported only then)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from presto_ray.cli.common import (
    EXAMPLES, FAILED, OK, BadInput, Subparsers, add_ray_options, fail, load_job_config, watch_engine_processes,
)  # fmt: skip

if TYPE_CHECKING:
    from presto_ray.job import JobConfig, JobSummary


def cmd_sample(args: argparse.Namespace) -> int:
    from presto_ray.engines import build_engine
    from presto_ray.job import run_job
    from presto_ray.models import ModelProvisionError
    from presto_ray.output import OutputPathError, PartCheckpoint, check_output_file, io_error_text, write_parquet_atomic
    from presto_ray.progress import Progress
    from presto_ray.prompts import PromptFileError, read_prompts

    if args.out == "-":
        return fail(STDOUT_OUT)
    try:
        config = load_job_config(args)
    except BadInput as e:
        return fail(str(e))
    if not args.verbose:
        quiet_engine_logs()
    if args.ray:
        return _sample_on_ray(args, config)
    if args.address:
        return fail("--address needs --ray")
    if args.fail_fast:
        return fail("--fail-fast needs --ray (the in-process job stops at any bad prompt)")
    args.out = args.out or "out/samples.parquet"
    try:  # before any work: the prompts are never overwritten, a bad --out never costs a run
        check_output_file(args.out, args.prompts)
        items = read_prompts(args.prompts)
        check_prompt_lengths(items, config)
    except (OutputPathError, PromptFileError, ModelProvisionError) as e:
        return fail(str(e))
    watch_engine_processes(config)
    try:
        engine = build_engine(config.engine)
    except ModelProvisionError as e:
        return fail(str(e))
    # finished rows go to part files as the job runs; a rerun after a kill keeps those whose
    # inputs are unchanged (PartCheckpoint); the output file is still written once, at the end
    parts = PartCheckpoint(args.out)
    resumed = parts.load()
    progress = Progress(len(items) * config.chains_per_prompt, enabled=not args.quiet)

    def finished(row: dict) -> None:
        parts.add(row)
        progress.update(f"{row['prompt_id']}#{row['chain']}")

    try:
        summary = run_job(items, config, engine, on_sample=finished, resumed=resumed)
        parts.flush()
    except ValueError as e:  # e.g. a prompt longer than the model's context
        return fail(str(e))
    except OSError as e:  # a part file (written atomically: no half-written file stays)
        return fail(
            f"--out {args.out}: cannot write the finished samples ({io_error_text(e)}); the {parts.files} "
            f"part file(s) written so far stay in {parts.folder}/ and a rerun resumes from them"
        )
    finally:
        engine.shutdown()
    try:
        write_parquet_atomic(summary.rows, args.out)
        parts.remove()
    except OSError as e:  # checked before sampling; the disk may still fill or the folder go
        return fail(
            f"--out {args.out}: cannot write the samples ({io_error_text(e)}); the finished samples stay in "
            f"{parts.folder}/ and a rerun resumes from them"
        )
    print(f"wrote {len(summary.rows)} samples to {args.out}")
    _print_summary(summary, args.show)
    return OK


STDOUT_OUT = (
    "--out -: the samples are Parquet, written to a file (with --ray, a folder) and the summary goes to "
    "standard output; give a path (./- for a file named '-')"
)


def non_negative(text: str) -> int:
    """argparse's type for a count that may be 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def quiet_engine_logs() -> None:
    """vLLM's own INFO and WARNING lines off (`--verbose` keeps them): set in the environment before
    any engine starts, so vLLM's spawned workers and Ray's replica actors read it too. A level the
    user set stays."""
    import os

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def check_prompt_lengths(items: list, config: JobConfig) -> None:
    """Refuse, before the engine starts, a prompt that does not fit the engine's context with the
    sampler's horizon: the HTTP service's rule (presto_ray.prompts.context_problem)."""
    from presto_ray.engines import build_tokenizer
    from presto_ray.job import encode_prompt
    from presto_ray.prompts import PromptFileError, context_problem

    tokenizer = build_tokenizer(config.engine)
    for item in items:
        tokens = encode_prompt(tokenizer, item)
        if problem := context_problem(len(tokens), config.sampler.horizon, config.engine.context_length, "horizon"):
            raise PromptFileError(f"prompt id={item.id!r}: {problem}")


def _print_summary(summary: JobSummary, show: int) -> None:
    for line in summary.lines():
        print(line)
    for row in summary.rows[:show]:
        print(f"- {row['prompt_id']}#{row['chain']}: {row['text'][:100]!r}")


def _sample_on_ray(args: argparse.Namespace, config: JobConfig) -> int:
    """The job on Ray Data: streamed read, the power-sampling stage, Parquet files in a folder,
    resumable through Ray's checkpointing (see deployments/data_job.py)."""
    try:
        from deployments.data_job import BadPromptRow, JobFailed, processor_config, run_data_job
    except ImportError as e:
        return fail(f"--ray needs Ray Data: pip install 'presto-ray[ray]' ({e})")
    from presto_ray.models import ModelProvisionError

    out = args.out or "out/samples"
    try:
        summary = run_data_job(
            args.prompts, out, processor_config(config, fail_fast=args.fail_fast), address=args.address, progress=not args.quiet
        )
    except (ModelProvisionError, BadPromptRow) as e:
        return fail(str(e))
    except ValueError as e:  # bad input file, the output folder holds other settings' samples, another writer
        return fail(str(e))
    except JobFailed as e:  # not the user's input: exit 1, one line (the cause is chained for debugging)
        print(f"presto-ray: job failed: {e}", file=sys.stderr)
        return FAILED
    print(f"wrote {summary.samples + summary.errors} rows to {out}/ ({summary.errors} with an error)")
    for line in summary.lines():
        print(line)
    return OK


def add_sample(sub: Subparsers) -> None:
    s = sub.add_parser("sample", help="sample prompts and write Parquet (the main job)")
    s.add_argument("--prompts", default=str(EXAMPLES), help="JSONL or Parquet with id and prompt/messages")
    s.add_argument(
        "--out", default=None, help="Parquet output: a file (default out/samples.parquet); with --ray a folder or URI (default out/samples)"
    )
    s.add_argument(
        "--config", default=None,
        help="YAML job config (engine, sampler, chains_per_prompt); default: the settings of configs/local.yaml, "
        "vLLM on the CPU with the packaged SmolLM2 (configs/toy.yaml needs no model)",
    )
    s.add_argument("--chains", type=int, default=None, help="chains per prompt (overrides the config)")
    s.add_argument("--seed", type=int, default=None, help="job seed (overrides the config)")
    s.add_argument("--show", type=non_negative, default=4, help="print this many sampled texts (0 or more)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--verbose", action="store_true", help="show the engine's own log lines (vLLM's INFO and WARNING)")
    s.add_argument(
        "--fail-fast", action="store_true",
        help="with --ray: stop at the first bad prompt (default: write its message in the 'error' column and go on)",
    )
    add_ray_options(s, "run on Ray Data: streamed read, a power-sampling actor pool sharing engine replicas, resumable")
    s.set_defaults(func=cmd_sample)


COMMANDS = {"sample": add_sample}
