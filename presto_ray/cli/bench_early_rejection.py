"""`presto-ray bench-early-rejection`: the serial chain replayed on a job config's engine, and the
share of rejected proposals' tokens exact early rejection never needs (bench/early_rejection.py,
imported only when it runs)."""

from __future__ import annotations

import argparse

from presto_ray.cli.common import EXAMPLES, FAILED, OK, BadInput, Subparsers, fail, progress


def cmd_bench_early_rejection(args: argparse.Namespace) -> int:
    import sys

    from presto_ray.cli.common import load_job_config
    from presto_ray.cli.sample import quiet_engine_logs
    from presto_ray.engines import build_engine
    from presto_ray.models import ModelProvisionError
    from presto_ray.prompts import PromptFileError, read_prompts

    from bench.early_rejection import SAMPLERS, format_report, passed, run_early_rejection_bench

    samplers = [s for s in args.samplers.split(",") if s]
    if not samplers or set(samplers) - set(SAMPLERS):
        return fail(f"--samplers: expected a comma-separated subset of {','.join(SAMPLERS)}, got {args.samplers!r}")
    if args.n is not None and args.n < 1:
        return fail(f"--n: expected at least 1 prompt, got {args.n}")
    try:
        config = load_job_config(args)
        update = {"block_size": args.block_size, "mh_steps": args.mh_steps, "fixed_length": args.fixed_length or None}
        sampler = config.sampler.model_dump() | {k: v for k, v in update.items() if v is not None}
        config = config.model_copy(update={"sampler": type(config.sampler).model_validate(sampler)})
        items = read_prompts(args.prompts)[: args.n]
    except (BadInput, PromptFileError, ValueError) as e:
        return fail(str(e))
    if not args.verbose:
        quiet_engine_logs()
    try:
        engine = build_engine(config.engine)
    except ModelProvisionError as e:
        return fail(str(e))
    try:
        report = run_early_rejection_bench(items, config, engine, samplers, out_json=args.out, progress=progress)
    finally:
        engine.shutdown()
    print(format_report(report))
    print(f"wrote {args.out}")
    if not passed(report):
        print("presto-ray: error: a replay differs from sample() or the bound rejected an accepted step", file=sys.stderr)
        return FAILED
    return OK


def add_bench_early_rejection(sub: Subparsers) -> None:
    e = sub.add_parser(
        "bench-early-rejection",
        help="the serial chain replayed: share of rejected proposals' tokens exact early rejection never needs (token counts)",
    )
    e.add_argument("--config", required=True, help="job config (engine and sampler), e.g. configs/local.yaml or configs/toy.yaml")
    e.add_argument("--prompts", default=str(EXAMPLES))
    e.add_argument("--n", type=int, default=None, help="only the first N prompts (default all)")
    e.add_argument("--mh-steps", type=int, default=None, help="K (default: the config's)")
    e.add_argument("--block-size", type=int, default=None, help="T (default: the config's)")
    e.add_argument("--fixed-length", action="store_true", help="EOS as an ordinary token (the config's fixed_length otherwise)")
    e.add_argument("--samplers", default="power_mh,entropy_cut,multi_try", help="comma-separated (multi_try: no bound)")
    e.add_argument("--out", required=True, help="JSON report (its folder is created)")
    e.add_argument("--verbose", action="store_true", help="keep vLLM's own log lines")
    e.set_defaults(func=cmd_bench_early_rejection)


COMMANDS = {"bench-early-rejection": add_bench_early_rejection}
