"""The `presto-ray` command line: `sample` (the main job), `validate`, `eval`, `serve` and the benchmarks."""

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
    if args.ray:
        return _sample_on_ray(args, config)
    if args.address:
        return _fail("--address needs --ray")
    if args.fail_fast:
        return _fail("--fail-fast needs --ray (the in-process job stops at any bad prompt)")
    try:
        items = read_prompts(args.prompts)
    except PromptFileError as e:
        return _fail(str(e))
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


def _sample_on_ray(args: argparse.Namespace, config) -> int:
    """The job on Ray Data: streamed read, the power-sampling stage, Parquet files in a folder,
    resumable through Ray's checkpointing (see deployments/data_job.py)."""
    try:
        from deployments.data_job import BadPromptRow, JobFailed, run_data_job
    except ImportError as e:
        return _fail(f"--ray needs Ray Data: pip install 'presto-ray[ray]' ({e})")
    from presto_ray.models import ModelProvisionError

    out = args.out or "out/samples"
    try:
        summary = run_data_job(
            args.prompts, out, config, address=args.address, progress=not args.quiet, fail_fast=args.fail_fast
        )
    except (ModelProvisionError, BadPromptRow) as e:
        return _fail(str(e))
    except ValueError as e:  # bad input file, the output folder holds other settings' samples, another writer
        return _fail(str(e))
    except JobFailed as e:  # not the user's input: exit 1, one line (the cause is chained for debugging)
        print(f"presto-ray: job failed: {e}", file=sys.stderr)
        return 1
    print(f"wrote {summary.samples + summary.errors} rows to {out}/ ({summary.errors} with an error)")
    for line in summary.lines():
        print(line)
    return 0


def _backend(args: argparse.Namespace, config):
    """Where validate and eval run: the in-process driver, or Ray (--ray)."""
    if args.ray:
        try:
            from actors.ray_backend import RayBackend
        except ImportError as e:
            raise _BadInput(f"--ray needs Ray: pip install 'presto-ray[ray]' ({e})") from None
        return RayBackend(config, address=args.address)
    if args.address:
        raise _BadInput("--address needs --ray")
    from presto_ray.backend import LocalBackend
    from presto_ray.engines import build_engine

    return LocalBackend(build_engine(config.engine), config.max_active_chains)


def _run_with_backend(args: argparse.Namespace, config, work) -> int:
    """Build the backend, run `work(backend)`, close it; bad input or a failed start is exit 2."""
    from presto_ray.models import ModelProvisionError

    try:
        backend = _backend(args, config)
    except _BadInput as e:
        return _fail(str(e))
    except ModelProvisionError as e:
        return _fail(str(e))
    try:
        return work(backend)
    except ValueError as e:  # e.g. a prompt longer than the model's context, a serial config
        return _fail(str(e))
    finally:
        backend.close()


def _provenance(config) -> dict:
    """When and with what a report was made (the command line, the engine spec)."""
    from datetime import datetime, timezone

    from presto_ray import __version__

    return {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "presto_ray_version": __version__,
        "argv": sys.argv[1:],
        "engine": config.engine.model_dump(),
    }


def cmd_validate(args: argparse.Namespace) -> int:
    from presto_ray.job import encode_prompt
    from presto_ray.output import write_json_atomic
    from presto_ray.prompts import PromptFileError, read_prompts
    from presto_ray.validate import Margins, run_validation

    try:
        config = _load_job_config(args)
        margins = Margins.parse(args.margin or [])
    except _BadInput as e:
        return _fail(str(e))
    except ValueError as e:
        return _fail(f"--margin: {e}")
    if not 0.0 < args.alpha_level < 0.5:
        return _fail("--alpha-level must be in (0, 0.5)")
    if config.sampler.traversal == "serial":
        return _fail("sampler.traversal is 'serial': validate compares serial with bfs or predictive prefetching")
    try:
        items = read_prompts(args.prompts)
    except PromptFileError as e:
        return _fail(str(e))

    def work(backend) -> int:
        prompts = [(item.id, encode_prompt(backend.tokenizer, item)) for item in items]
        report = run_validation(
            backend,
            prompts,
            config.sampler,
            chains_per_prompt=config.chains_per_prompt,
            margins=margins,
            alpha_level=args.alpha_level,
            fault=args.fault,
            progress=lambda msg: print(msg, file=sys.stderr, flush=True),
        )
        write_json_atomic({**report.to_json(), **_provenance(config)}, args.out)
        side = config.sampler.traversal + ("/streaming" if config.sampler.schedule == "streaming" else "")
        n = len(prompts) * config.chains_per_prompt
        print(f"serial vs {side}: {len(prompts)} prompts x {config.chains_per_prompt} chains = {n} samples per side"
              + (" (FAULT: prefetching without the length correction)" if args.fault else ""))
        print(report.table())
        for note in report.notes:
            print(f"note: {note}")
        print(f"equivalent: {report.equivalent}   (wall time: serial {report.wall_time_s['serial']:.1f} s, "
              f"prefetch {report.wall_time_s['prefetch']:.1f} s)")
        print(f"wrote {args.out}")
        return 0

    return _run_with_backend(args, config, work)


def cmd_eval(args: argparse.Namespace) -> int:
    from presto_ray.eval_tasks import build_task
    from presto_ray.evaluate import METHODS, plot_report, run_eval
    from presto_ray.output import write_json_atomic

    try:
        config = _load_job_config(args)
    except _BadInput as e:
        return _fail(str(e))
    methods = args.methods.split(",") if args.methods else list(METHODS)
    if unknown := set(methods) - set(METHODS):
        return _fail(f"--methods: unknown {sorted(unknown)}; known: {','.join(METHODS)}")
    try:
        problems = build_task(args.task, args.n, args.task_seed)
    except ValueError as e:
        return _fail(str(e))

    def work(backend) -> int:
        report = run_eval(
            backend, problems, config.sampler, task=args.task, seed=config.sampler.seed, methods=methods,
            progress=lambda msg: print(msg, file=sys.stderr, flush=True),
        )  # fmt: skip
        write_json_atomic({**report.to_json(), **_provenance(config)}, args.out)
        print(f"{args.task}: {len(problems)} problems (task seed {args.task_seed}), answers up to {config.sampler.horizon} tokens")
        print(report.table())
        wrote = [args.out]
        if args.png:
            plot_report(report, args.png)
            wrote.append(args.png)
        print("wrote " + " and ".join(wrote))
        return 0

    return _run_with_backend(args, config, work)


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
    from bench.virtual_clock import (
        format_latency_report,
        format_load_report,
        format_report,
        plot,
        run_latency_bench,
        run_load_bench,
        run_virtual_clock_bench,
    )

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
    latency_out = str(Path(out).with_name(Path(out).stem + "_latency.json"))
    print(format_latency_report(run_latency_bench(out_json=latency_out, progress=progress)))
    load_out = str(Path(out).with_name(Path(out).stem + "_load.json"))
    print(format_load_report(run_load_bench(out_json=load_out, progress=progress)))
    print(f"wrote {out}, {png}, {latency_out} and {load_out}")
    return 0


def cmd_bench_real(args: argparse.Namespace) -> int:
    from bench.real import VARIANT_RUNS, format_report, run_real_bench
    from presto_ray.engines.specs import VLLMEngineConfig

    report = run_real_bench(
        args.prompts,
        engine_config=VLLMEngineConfig(logp0_from=args.logp0_from),
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


def cmd_bench_coordinator(args: argparse.Namespace) -> int:
    from bench.coordinator_rate import format_report, run_coordinator_bench

    try:
        chains = tuple(int(c) for c in args.chains.split(","))
        shards = tuple(int(s) for s in args.shards.split(","))
    except ValueError:
        return _fail("--chains / --shards: expected comma-separated integers")
    if any(c < 1 for c in chains + shards):
        return _fail("--chains / --shards: every count must be at least 1")
    report = run_coordinator_bench(
        chains, shards, duration_s=args.duration, out_json=args.out, progress=lambda msg: print(msg, file=sys.stderr, flush=True)
    )
    print(format_report(report))
    print(f"wrote {args.out}")
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


def cmd_load_test(args: argparse.Namespace) -> int:
    try:
        clients = [int(c) for c in args.clients.split(",")]
    except ValueError:
        return _fail(f"--clients must be comma-separated integers, got {args.clients!r}")
    if not clients or min(clients) < 1 or args.duration <= 0 or args.passes < 1:
        return _fail("--clients, --duration and --passes must be positive")
    try:
        from bench.load_test import format_report, passed, run_load_test
    except ImportError as e:
        return _fail(f"load-test needs Ray Serve and httpx: pip install 'presto-ray[ray,bench]' ({e})")
    report = run_load_test(clients, args.duration, args.passes, args.out, progress=lambda m: print(m, file=sys.stderr, flush=True))
    print(format_report(report))
    print(f"wrote {args.out}")
    return 0 if passed(report) else 1


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


def _add_ray_options(parser: argparse.ArgumentParser, ray_help: str | None) -> None:
    """`--address` (and `--ray` with `ray_help`; None: the command always runs on Ray)."""
    if ray_help is not None:
        parser.add_argument("--ray", action="store_true", help=ray_help)
    parser.add_argument("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS, else a local Ray)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="presto-ray", description="Exact power sampling with PreSTO prefetching.")
    sub = parser.add_subparsers(dest="command", required=True)

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
    _add_ray_options(s, "run on Ray Data: streamed read, a power-sampling actor pool sharing engine replicas, resumable")
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
    r.add_argument(
        "--logp0-from", choices=["sampler", "scoring_pass"], default="sampler",
        help="log p0 from the generating pass (default) or a second scoring pass (the engine's logp0_from)",
    )  # fmt: skip
    r.set_defaults(func=cmd_bench_real)

    v = sub.add_parser("serve", help="the OpenAI-compatible HTTP service on Ray Serve (Ctrl-C stops it)")
    v.add_argument("--config", default=None, help="YAML job config (engine, sampler defaults, ray, serve)")
    v.add_argument("--host", default=None, help="bind address (overrides serve.host; default 127.0.0.1)")
    v.add_argument("--port", type=int, default=None, help="port (overrides serve.port; default 8000)")
    _add_ray_options(v, None)
    v.set_defaults(func=cmd_serve)

    a = sub.add_parser(
        "validate",
        help="TOST: does prefetching sample the serial chain's law on this model? (serial vs the config's traversal)",
    )
    a.add_argument("--config", default=None, help="YAML job config (engine, sampler; its traversal is the prefetching side)")
    a.add_argument("--prompts", default=str(EXAMPLES), help="JSONL or Parquet with id and prompt/messages")
    a.add_argument("--chains", type=int, default=None, help="chains per prompt and side (overrides chains_per_prompt)")
    a.add_argument("--seed", type=int, default=None, help="seed of both sides' chains (overrides the config)")
    a.add_argument("--out", default="out/validate.json", help="JSON report (top-level key `equivalent`)")
    a.add_argument(
        "--margin", action="append", default=None, metavar="SD|NAME=VALUE",
        help="equivalence margin: a number sets every statistic's margin in pooled standard deviations "
        "(default 0.5); NAME=VALUE an absolute margin for one statistic (mean_logp0, length, alpha_logp0, "
        "acceptance_rate); repeatable",
    )  # fmt: skip
    a.add_argument("--alpha-level", type=float, default=0.05, help="level of each one-sided test (default 0.05: a 90%% CI)")
    a.add_argument("--fault", action="store_true", help="break the prefetching side's kernel (no length correction): the check must fail")
    _add_ray_options(a, "run the chains through Ray (replicas and the batching coordinator)")
    a.set_defaults(func=cmd_validate)

    e = sub.add_parser("eval", help="accuracy on a verifiable task: greedy, temperature 1, tau = 1/alpha, power sampling")
    e.add_argument("--config", default=None, help="YAML job config (engine, sampler: alpha, steps, horizon)")
    e.add_argument("--task", default="arithmetic", help="the task (arithmetic: generated word problems, levels 1-3)")
    e.add_argument("--n", type=int, default=30, help="problems (default 30)")
    e.add_argument("--task-seed", type=int, default=0, help="seed of the generated problems")
    e.add_argument("--seed", type=int, default=None, help="seed of the sampling methods (overrides the config)")
    e.add_argument("--methods", default=None, help="comma-separated subset of greedy,temperature_1,low_temperature,power")
    e.add_argument("--out", default="out/eval.json", help="JSON report (key `methods`)")
    e.add_argument("--png", default="out/eval.png", help="plot of accuracy and log-likelihood ('' for none)")
    _add_ray_options(e, "run through Ray (replicas and the batching coordinator)")
    e.set_defaults(func=cmd_eval)

    lt = sub.add_parser(
        "load-test", help="a bounded load test of the HTTP service on 127.0.0.1 (toy engine; stops by itself)"
    )
    lt.add_argument("--clients", default="8,32,128", help="concurrent clients per round (default 8,32,128)")
    lt.add_argument("--duration", type=float, default=10.0, help="seconds each round sends requests (default 10)")
    lt.add_argument("--passes", type=int, default=2, help="times over the client counts (memory must stay flat)")
    lt.add_argument("--out", default="bench/results/load_test.json", help="JSON report")
    lt.set_defaults(func=cmd_load_test)

    y = sub.add_parser("bench-ray", help="Ray throughput against concurrent chains (toy latency model, vLLM)")
    y.add_argument("--chains", default="1,2,4,8,16,32,64", help="chain counts on the toy engine")
    y.add_argument("--vllm-chains", default="", help="chain counts on vLLM (CPU), e.g. 1,2,4,8,16")
    y.add_argument("--out", default="bench/results/ray.json")
    y.add_argument("--png", default="bench/results/ray.png")
    y.set_defaults(func=cmd_bench_ray)

    b = sub.add_parser("bench-coordinator", help="requests per second through 1, 2, 4 coordinator shards (toy engine)")
    b.add_argument("--chains", default="64,256,1024", help="concurrent simulated chains")
    b.add_argument("--shards", default="1,2,4", help="coordinator shard counts")
    b.add_argument("--duration", type=float, default=5.0, help="seconds each setting runs")
    b.add_argument("--out", default="bench/results/coordinator_rate.json")
    b.set_defaults(func=cmd_bench_coordinator)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
