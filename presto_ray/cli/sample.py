"""`presto-ray sample`: the main job, in process (presto_ray/job.py) or on Ray Data (`--ray`:
deployments/data_job.py, imported only then)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from presto_ray.cli.common import EXAMPLES, FAILED, OK, BadInput, Subparsers, add_ray_options, fail, load_job_config

if TYPE_CHECKING:
    from presto_ray.job import JobConfig, JobSummary


def cmd_sample(args: argparse.Namespace) -> int:
    from presto_ray.engines import build_engine
    from presto_ray.job import run_job
    from presto_ray.models import ModelProvisionError
    from presto_ray.output import write_parquet_atomic
    from presto_ray.progress import Progress
    from presto_ray.prompts import PromptFileError, read_prompts

    try:
        config = load_job_config(args)
    except BadInput as e:
        return fail(str(e))
    if args.ray:
        return _sample_on_ray(args, config)
    if args.address:
        return fail("--address needs --ray")
    if args.fail_fast:
        return fail("--fail-fast needs --ray (the in-process job stops at any bad prompt)")
    try:
        items = read_prompts(args.prompts)
    except PromptFileError as e:
        return fail(str(e))
    args.out = args.out or "out/samples.parquet"
    try:
        engine = build_engine(config.engine)
    except ModelProvisionError as e:
        return fail(str(e))
    progress = Progress(len(items) * config.chains_per_prompt, enabled=not args.quiet)
    try:
        summary = run_job(items, config, engine, on_sample=lambda row: progress.update(f"{row['prompt_id']}#{row['chain']}"))
    except ValueError as e:  # e.g. a prompt longer than the model's context
        return fail(str(e))
    finally:
        engine.shutdown()
    write_parquet_atomic(summary.rows, args.out)
    print(f"wrote {len(summary.rows)} samples to {args.out}")
    _print_summary(summary, args.show)
    return OK


def _print_summary(summary: JobSummary, show: int) -> None:
    for line in summary.lines():
        print(line)
    for row in summary.rows[:show]:
        print(f"- {row['prompt_id']}#{row['chain']}: {row['text'][:100]!r}")


def _sample_on_ray(args: argparse.Namespace, config: JobConfig) -> int:
    """The job on Ray Data: streamed read, the power-sampling stage, Parquet files in a folder,
    resumable through Ray's checkpointing (see deployments/data_job.py)."""
    try:
        from deployments.data_job import BadPromptRow, JobFailed, run_data_job
    except ImportError as e:
        return fail(f"--ray needs Ray Data: pip install 'presto-ray[ray]' ({e})")
    from presto_ray.models import ModelProvisionError

    out = args.out or "out/samples"
    try:
        summary = run_data_job(
            args.prompts, out, config, address=args.address, progress=not args.quiet, fail_fast=args.fail_fast
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
    s.add_argument("--config", default=None, help="YAML job config (engine, sampler, chains_per_prompt)")
    s.add_argument("--chains", type=int, default=None, help="chains per prompt (overrides the config)")
    s.add_argument("--seed", type=int, default=None, help="job seed (overrides the config)")
    s.add_argument("--show", type=int, default=4, help="print this many sampled texts")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument(
        "--fail-fast", action="store_true",
        help="with --ray: stop at the first bad prompt (default: write its message in the 'error' column and go on)",
    )
    add_ray_options(s, "run on Ray Data: streamed read, a power-sampling actor pool sharing engine replicas, resumable")
    s.set_defaults(func=cmd_sample)


COMMANDS = {"sample": add_sample}
