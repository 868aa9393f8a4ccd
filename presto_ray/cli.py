"""The `presto-ray` command line: `sample` (the main job) and `bench`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import ValidationError

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "prompts.jsonl"


def _fail(message: str) -> int:
    print(f"presto-ray: error: {message}", file=sys.stderr)
    return 2


def _validation_message(error: ValidationError, source: str) -> str:
    from presto_ray.config import error_text

    parts = []
    for e in error.errors():
        field = ".".join(str(p) for p in e["loc"])
        named = getattr((e.get("ctx") or {}).get("error"), "field", None)  # a cross-field rule's field
        if named:
            field = f"{field}.{named}" if field else named
        parts.append(f"{field or '(root)'}: {error_text(e)}")
    return f"{source}: invalid configuration: " + "; ".join(parts)


class _BadInput(Exception):
    """A message for the user (exit status 2)."""


def _load_job_config(args: argparse.Namespace):
    """The job config from --config plus command-line overrides; _BadInput names what is wrong."""
    from presto_ray.job import JobConfig

    source = args.config or "default configuration"
    try:
        config = JobConfig.from_yaml(args.config) if args.config else JobConfig()
        overrides = {}
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
        raise _BadInput(_validation_message(e, source)) from None
    except (OSError, ValueError) as e:
        raise _BadInput(f"{args.config}: {e}") from None
    return config


def cmd_sample(args: argparse.Namespace) -> int:
    from presto_ray.engines import build_engine
    from presto_ray.job import run_job
    from presto_ray.models import ModelProvisionError
    from presto_ray.output import write_parquet_atomic
    from presto_ray.progress import Progress
    from presto_ray.prompts import PromptFileError, read_prompts

    try:
        config = _load_job_config(args)
    except _BadInput as e:
        return _fail(str(e))
    try:
        items = read_prompts(args.prompts)
    except PromptFileError as e:
        return _fail(str(e))

    if args.ray:
        return _sample_on_ray(args, items, config)
    if args.address:
        return _fail("--address needs --ray")
    args.out = args.out or "out/samples.parquet"
    try:
        engine = build_engine(config.engine)
    except ModelProvisionError as e:
        return _fail(str(e))
    progress = Progress(len(items) * config.chains_per_prompt, enabled=not args.quiet)
    try:
        summary = run_job(items, config, engine, on_sample=lambda row: progress.update(f"{row['prompt_id']}#{row['chain']}"))
    except ValueError as e:  # e.g. a prompt longer than the model's context
        return _fail(str(e))
    finally:
        engine.shutdown()
    write_parquet_atomic(summary.rows, args.out)
    print(f"wrote {len(summary.rows)} samples to {args.out}")
    _print_summary(summary, args.show)
    return 0


def _print_summary(summary, show: int) -> None:
    for line in summary.lines():
        print(line)
    for row in summary.rows[:show]:
        print(f"- {row['prompt_id']}#{row['chain']}: {row['text'][:100]!r}")


def _sample_on_ray(args: argparse.Namespace, items, config) -> int:
    """The same job on Ray: shards in a folder, resumable (see deployments/batch_job.py)."""
    try:
        from deployments.batch_job import JobFailed, run_ray_job
    except ImportError as e:
        return _fail(f"--ray needs Ray: pip install 'presto-ray[ray]' ({e})")
    from presto_ray.models import ModelProvisionError
    from presto_ray.progress import Progress

    out = args.out or "out/samples"
    progress: list[Progress] = []

    def on_start(pending: int, skipped: int) -> None:
        if skipped:
            print(f"resuming: {skipped} (prompt, chain) pairs already in {out}, {pending} to sample", file=sys.stderr)
        progress.append(Progress(pending, enabled=not args.quiet))

    try:
        summary = run_ray_job(
            items,
            config,
            out,
            address=args.address,
            on_start=on_start,
            on_sample=lambda row: progress[0].update(f"{row['prompt_id']}#{row['chain']}"),
        )
    except ModelProvisionError as e:
        return _fail(str(e))
    except ValueError as e:  # the output folder holds other inputs' samples, or another job writes there
        return _fail(str(e))
    except JobFailed as e:  # not the user's input: exit 1, one line (the cause is chained for debugging)
        print(f"presto-ray: job failed: {e}", file=sys.stderr)
        return 1
    print(f"wrote {len(summary.rows)} samples to {out}/ ({summary.skipped + summary.samples} in all)")
    _print_summary(summary, args.show)
    return 0


def cmd_model(args: argparse.Namespace) -> int:
    from presto_ray.models import ModelProvisionError, prepare_smollm2

    try:
        path = prepare_smollm2(args.dir, force=args.force)
    except ModelProvisionError as e:
        return _fail(str(e))
    print(path)
    return 0


def _budgets(text: str) -> tuple[int, ...]:
    try:
        budgets = tuple(int(b) for b in text.split(","))
    except ValueError:
        raise _BadInput(f"--budgets: expected comma-separated integers, got {text!r}") from None
    if any(b < 1 for b in budgets):
        raise _BadInput("--budgets: every budget must be at least 1")
    return budgets


def cmd_bench(args: argparse.Namespace) -> int:
    if args.virtual_clock:
        return _bench_virtual_clock(args)
    from bench.toy import format_report, run_toy_bench

    args.out = args.out or "bench/results/toy.json"
    try:
        budgets = _budgets(args.budgets or "8,10,12,16,20")
    except _BadInput as e:
        return _fail(str(e))
    report = run_toy_bench(
        budgets=budgets,
        num_chains=args.chains,
        mh_steps=args.mh_steps,
        block_size=args.block_size,
        out_json=args.out,
        progress=lambda msg: print(msg, file=sys.stderr),
    )
    print(format_report(report))
    print(f"wrote {args.out}")
    return 0


def _bench_virtual_clock(args: argparse.Namespace) -> int:
    from bench.virtual_clock import format_load_report, format_report, plot, run_load_bench, run_virtual_clock_bench

    out = args.out or "bench/results/virtual_clock.json"
    try:
        budgets = _budgets(args.budgets or "8,20")
    except _BadInput as e:
        return _fail(str(e))
    progress = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    rows = run_virtual_clock_bench(budgets=budgets, out_json=out, progress=progress)
    print(format_report(rows))
    png = Path(out).with_suffix(".png")
    plot(rows, png)
    load_out = str(Path(out).with_name(Path(out).stem + "_load.json"))
    print(format_load_report(run_load_bench(out_json=load_out, progress=progress)))
    print(f"wrote {out}, {png} and {load_out}")
    return 0


def cmd_bench_real(args: argparse.Namespace) -> int:
    from bench.real import VARIANT_RUNS, format_report, run_real_bench

    report = run_real_bench(
        args.prompts,
        budgets=tuple(int(b) for b in args.budgets.split(",")),
        runs=VARIANT_RUNS if args.variants else None,
        mh_steps=args.mh_steps,
        block_size=args.block_size,
        out_json=args.out,
        out_png=args.png,
        progress=lambda msg: print(msg, file=sys.stderr, flush=True),
    )
    print(format_report(report))
    print(f"wrote {args.out}" + (f" and {args.png}" if Path(args.png).exists() else ""))
    return 0


def cmd_bench_ray(args: argparse.Namespace) -> int:
    from bench.ray_throughput import format_report, run_ray_bench

    try:
        chains = tuple(int(c) for c in args.chains.split(","))
        vllm_chains = tuple(int(c) for c in args.vllm_chains.split(",")) if args.vllm_chains else ()
    except ValueError:
        return _fail("--chains / --vllm-chains: expected comma-separated integers")
    if any(c < 1 for c in chains + vllm_chains):
        return _fail("--chains / --vllm-chains: every count must be at least 1")
    report = run_ray_bench(
        chain_counts=chains,
        vllm_chain_counts=vllm_chains,
        out_json=args.out,
        out_png=args.png,
        progress=lambda msg: print(msg, file=sys.stderr, flush=True),
    )
    print(format_report(report))
    print(f"wrote {args.out} and {args.png}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        config = _load_job_config(args)
    except _BadInput as e:
        return _fail(str(e))
    try:
        from deployments.serve_app import run_service
    except ImportError as e:
        return _fail(f"serve needs Ray Serve: pip install 'presto-ray[ray]' ({e})")
    run_service(config, address=args.address)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="presto-ray", description="Exact power sampling with PreSTO prefetching.")
    sub = parser.add_subparsers(dest="command", required=True)

    s = sub.add_parser("sample", help="sample prompts and write Parquet (the main job)")
    s.add_argument("--prompts", default=str(EXAMPLES), help="JSONL or Parquet with id and prompt/messages")
    s.add_argument(
        "--out", default=None, help="Parquet output: a file (default out/samples.parquet); with --ray a folder of shards (default out/samples)"
    )
    s.add_argument("--config", default=None, help="YAML job config (engine, sampler, chains_per_prompt)")
    s.add_argument("--chains", type=int, default=None, help="chains per prompt (overrides the config)")
    s.add_argument("--seed", type=int, default=None, help="job seed (overrides the config)")
    s.add_argument("--show", type=int, default=4, help="print this many sampled texts")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--ray", action="store_true", help="run on Ray: engine replicas, a batching coordinator, chain actors")
    s.add_argument("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS, else a local Ray)")
    s.set_defaults(func=cmd_sample)

    m = sub.add_parser("model", help="prepare the packaged SmolLM2-135M-Instruct (offline) and print its folder")
    m.add_argument("--dir", default=None, help="target folder (default: the user cache)")
    m.add_argument("--force", action="store_true", help="convert again even if prepared")
    m.set_defaults(func=cmd_model)

    b = sub.add_parser("bench", help="serial vs bfs vs predictive on the toy engine (--virtual-clock: rounds vs streaming)")
    b.add_argument("--budgets", default=None, help="prefetch budgets (default 8,10,12,16,20; --virtual-clock: 8,20)")
    b.add_argument("--chains", type=int, default=8)
    b.add_argument("--mh-steps", type=int, default=100)
    b.add_argument("--block-size", type=int, default=64)
    b.add_argument("--out", default=None, help="JSON output (default bench/results/toy.json or virtual_clock.json)")
    b.add_argument(
        "--virtual-clock", action="store_true",
        help="serial vs rounds vs streaming in decode steps on the toy's continuous-batching clock: one chain per "
        "device (--out, a JSON list of rows) and 1, 8, 64 chains sharing one device (*_load.json)",
    )
    b.set_defaults(func=cmd_bench)

    r = sub.add_parser("bench-real", help="serial vs rounds vs streaming on vLLM with the real model (wall clock)")
    r.add_argument("--prompts", default=str(EXAMPLES))
    r.add_argument("--budgets", default="4,8,16")
    r.add_argument("--mh-steps", type=int, default=20)
    r.add_argument("--block-size", type=int, default=48)
    r.add_argument("--out", default="bench/results/vllm_cpu_streaming.json")
    r.add_argument("--png", default="bench/results/vllm_cpu_streaming.png")
    r.add_argument("--variants", action="store_true", help="PowerMH, EntropyCut and MultiTryMH: serial vs prefetching")
    r.set_defaults(func=cmd_bench_real)

    v = sub.add_parser("serve", help="the OpenAI-compatible HTTP service on Ray Serve (Ctrl-C stops it)")
    v.add_argument("--config", default=None, help="YAML job config (engine, sampler defaults, ray, serve)")
    v.add_argument("--host", default=None, help="bind address (overrides serve.host; default 127.0.0.1)")
    v.add_argument("--port", type=int, default=None, help="port (overrides serve.port; default 8000)")
    v.add_argument("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS, else a local Ray)")
    v.set_defaults(func=cmd_serve)

    y = sub.add_parser("bench-ray", help="Ray throughput against concurrent chains (toy latency model, vLLM)")
    y.add_argument("--chains", default="1,2,4,8,16,32,64", help="chain counts on the toy engine")
    y.add_argument("--vllm-chains", default="", help="chain counts on vLLM (CPU), e.g. 1,2,4,8,16")
    y.add_argument("--out", default="bench/results/ray.json")
    y.add_argument("--png", default="bench/results/ray.png")
    y.set_defaults(func=cmd_bench_ray)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
