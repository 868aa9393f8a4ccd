"""`presto-ray bench-real`: serial vs rounds vs streaming on vLLM with the real model, or on
--config's engine (bench/real.py, imported only when it runs); with --chains, the load bench
(bench_real_load.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from presto_ray.cli.bench_common import parse_budgets
from presto_ray.cli.bench_real_engine import LOGP0_WITH_CONFIG, check_prompts, on_engine
from presto_ray.cli.bench_real_load import bench_real_load
from presto_ray.cli.common import EXAMPLES, OK, BadInput, Subparsers, fail, progress


BENCH_REAL_OUT = "bench/results/vllm_cpu_streaming.json"
BENCH_REAL_PNG = "bench/results/vllm_cpu_streaming.png"


def cmd_bench_real(args: argparse.Namespace) -> int:
    try:
        budgets = parse_budgets(args.budgets)
    except BadInput as e:
        return fail(str(e))
    if args.n is not None and args.n < 1:
        return fail(f"--n: expected at least 1 prompt, got {args.n}")
    for flag, value in (("--mh-steps", args.mh_steps), ("--block-size", args.block_size)):
        if value is not None and value < (0 if flag == "--mh-steps" else 1):
            return fail(f"{flag}: expected {'0 or more' if flag == '--mh-steps' else 'at least 1'}, got {value}")
    if args.chain_counts is not None:
        return bench_real_load(args)
    for flag, value in (("--device-curve", args.replay_curve), ("--repeats", args.repeats)):
        if value is not None:
            return fail(f"{flag} is the load bench's: give --chains too")
    if args.config is not None:
        return _bench_real_from_config(args, budgets)
    from bench.real import VARIANT_RUNS, format_report, format_samples_check, run_real_bench
    from presto_ray.engines.specs import VLLMEngineConfig

    args.out = args.out or BENCH_REAL_OUT
    args.png = args.png or BENCH_REAL_PNG
    report = run_real_bench(
        args.prompts,
        engine_config=VLLMEngineConfig(logp0_from=args.logp0_from or "sampler"),
        budgets=budgets,
        runs=VARIANT_RUNS if args.variants else None,
        mh_steps=20 if args.mh_steps is None else args.mh_steps,
        block_size=48 if args.block_size is None else args.block_size,
        out_json=args.out,
        out_png=args.png,
        progress=progress,
        early_rejection=args.early_rejection or "both",
        num_prompts=args.n,
    )
    print(format_report(report))
    print(format_samples_check(report))
    print(f"wrote {args.out}" + (f" and {args.png}" if Path(args.png).exists() else ""))
    return OK


def _bench_real_from_config(args: argparse.Namespace, budgets: tuple[int, ...]) -> int:
    """bench-real on the engine a job config's `engine:` section builds (as `presto-ray sample`
    does), with its sampler's settings; exit 1 where a run's samples differ from serial's."""
    from presto_ray.cli.common import load_job_config

    if args.logp0_from is not None:
        return fail(LOGP0_WITH_CONFIG)
    try:
        config = load_job_config(args)
        check_prompts(args)
    except BadInput as e:
        return fail(str(e))
    from bench.real import VARIANT_RUNS, format_report, format_samples_check, run_real_bench

    out = args.out or f"bench/results/{Path(args.config).stem}_bench_real.json"
    png = args.png or str(Path(out).with_suffix(".png"))
    return on_engine(
        args, config, f"--config {args.config}", out, png,
        lambda engine: run_real_bench(
            args.prompts,
            engine=engine,
            engine_spec=config.engine,
            sampler_config=config.sampler,
            seed=config.sampler.seed,
            budgets=budgets,
            runs=VARIANT_RUNS if args.variants else None,
            mh_steps=config.sampler.mh_steps if args.mh_steps is None else args.mh_steps,
            block_size=config.sampler.block_size if args.block_size is None else args.block_size,
            out_json=out,
            out_png=png,
            progress=progress,
            early_rejection=args.early_rejection or "both",
            num_prompts=args.n,
        ),
        format_report, format_samples_check,
    )  # fmt: skip


def add_bench_real(sub: Subparsers) -> None:
    r = sub.add_parser(
        "bench-real", help="serial vs rounds vs streaming on vLLM with the real model, or --config's engine (wall clock)"
    )
    r.add_argument(
        "--config", default=None,
        help="a job config (e.g. configs/transformers.yaml): its engine section builds the engine, as for "
        "`presto-ray sample`, and its sampler gives alpha and the rest (default: vLLM on the CPU, alpha 4); "
        "exit 1 if a run's samples differ from serial's",
    )  # fmt: skip
    r.add_argument("--prompts", default=str(EXAMPLES))
    r.add_argument("--budgets", default="4,8,16", help="prefetch budgets (default 4,8,16; not with --chains)")
    r.add_argument(
        "--chains", default=None, dest="chain_counts", metavar="CHAINS",
        help="load bench: numbers of chains in flight at once, e.g. 1,4,16,64 (chain i on prompt i %% P): serial, "
        "rounds and streaming, early rejection off and on, all chains in one call, on --config's engine and "
        "sampler (its prefetch budget) or the default vLLM engine; report bench/results/<config name or "
        "vllm_cpu>_load.json",
    )  # fmt: skip
    r.add_argument(
        "--settings", choices=["standard", "all"], default="standard",
        help="--chains: serial, rounds and streaming off and on (standard), or also serial chains streamed (all: "
        "each chain's next request sent as soon as its last ends, not with the round's slowest)",
    )
    r.add_argument(
        "--repeats", type=int, default=None,
        help="--chains: times over the settings, order reversed each time (default 2; with --device-curve 1)",
    )
    r.add_argument(
        "--device-curve", default=None, dest="replay_curve", metavar="CURVE",
        help="--chains: replay the engine on the virtual clock of this measured device (a JSON DeviceCurve): "
        "the same runs, every completion the engine's own (each computed once), time in the curve's virtual "
        "seconds, a prediction to set beside the wall-clock run (bench/replay.py); default --repeats 1",
    )
    r.add_argument("--mh-steps", type=int, default=None, help="K (default 20; with --config, the config's)")
    r.add_argument("--block-size", type=int, default=None, help="T (default 48; with --config, the config's)")
    r.add_argument(
        "--out", default=None,
        help=f"JSON report (default {BENCH_REAL_OUT}; with --config, bench/results/<config name>_bench_real.json)",
    )
    r.add_argument("--png", default=None, help=f"plot (default {BENCH_REAL_PNG}; with --config, beside --out)")
    r.add_argument("--verbose", action="store_true", help="--config: keep the engine's own log lines")
    r.add_argument("--variants", action="store_true", help="PowerMH, EntropyCut and MultiTryMH: serial vs prefetching")
    r.add_argument(
        "--early-rejection", choices=["both", "on", "off"], default=None,
        help="exact early rejection: every run off and on side by side (both, the default; ratios vs serial off), "
        "or only one setting (not with --chains: always both)",
    )
    r.add_argument("--n", type=int, default=None, help="only the first N prompts (default all)")
    r.add_argument(
        "--logp0-from", choices=["sampler", "scoring_pass"], default=None,
        help="log p0 from the generating pass (default) or a second scoring pass (the default vLLM engine's "
        "logp0_from; not with --config)",
    )  # fmt: skip
    r.set_defaults(func=cmd_bench_real)


COMMANDS = {"bench-real": add_bench_real}
