"""The benchmark subcommands of `presto-ray`: bench, bench-real, bench-coordinator, bench-ray,
load-test, bench-early-rejection: their arguments and handlers, registered through `COMMANDS` when
the command line builds its parser. The benchmarks themselves are the `bench` package, a layer
above the library that never imports the command line back.

Light to import: each handler imports its benchmark (numpy, vLLM, Ray, httpx) only when it runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from presto_ray.cli.common import EXAMPLES, FAILED, OK, BadInput, Subparsers, comma_ints, fail, progress

if TYPE_CHECKING:
    from collections.abc import Callable

    from presto_ray.engines.base import Engine
    from presto_ray.engines.device_curve import DeviceCurve
    from presto_ray.job import JobConfig


def _budgets(text: str) -> tuple[int, ...]:
    return comma_ints(
        text,
        invalid="--budgets: expected comma-separated integers, got {text!r}",
        below_one="--budgets: every budget must be at least 1",
    )


def cmd_bench(args: argparse.Namespace) -> int:
    if args.virtual_clock:
        return _bench_virtual_clock(args)
    if args.host_time:
        return _bench_host_time(args)
    from bench.toy import format_report, run_toy_bench

    args.out = args.out or "bench/results/toy.json"
    try:
        budgets = _budgets(args.budgets or "8,10,12,16,20")
    except BadInput as e:
        return fail(str(e))
    report = run_toy_bench(
        budgets=budgets,
        num_chains=args.chains,
        mh_steps=100 if args.mh_steps_given is None else args.mh_steps_given,
        block_size=64 if args.block_size_given is None else args.block_size_given,
        out_json=args.out,
        progress=progress,
    )
    print(format_report(report))
    print(f"wrote {args.out}")
    return OK


def _bench_host_time(args: argparse.Namespace) -> int:
    from bench.host_time import BASE, format_report, run_host_time_bench

    out = args.out or "bench/results/host_time.json"
    try:
        counts = comma_ints(
            args.chain_counts,
            invalid="--chain-counts: expected comma-separated integers, got {text!r}",
            below_one="--chain-counts: every count must be at least 1",
        )
    except BadInput as e:
        return fail(str(e))
    # --mh-steps and --block-size default to the toy bench's; here the toy job's sampler decides
    update = {}
    if args.mh_steps_given is not None:
        update["mh_steps"] = args.mh_steps_given
    if args.block_size_given is not None:
        update["block_size"] = args.block_size_given
    report = run_host_time_bench(counts, BASE.model_copy(update=update), profile=args.profile, out_json=out, progress=progress)
    print(format_report(report))
    print(f"wrote {out}")
    return OK if all(row["same_as_serial"] for row in report["rows"]) else FAILED


def _bench_virtual_clock(args: argparse.Namespace) -> int:
    from bench.virtual_clock import format_latency_report, format_report, plot, run_latency_bench, run_virtual_clock_bench
    from bench.virtual_clock_load import format_load_report, load_devices, plot_load, run_load_bench

    out = args.out or "bench/results/virtual_clock.json"
    if args.saturation is not None and not args.saturation > 0:
        return fail(f"--saturation: expected a positive number of sequences, got {args.saturation}")
    try:
        budgets = _budgets(args.budgets or "8,20")
    except BadInput as e:
        return fail(str(e))
    written = []
    if not args.load_only:
        rows = run_virtual_clock_bench(budgets=budgets, out_json=out, progress=progress)
        print(format_report(rows))
        png = Path(out).with_suffix(".png")
        plot(rows, png)
        latency_out = str(Path(out).with_name(Path(out).stem + "_latency.json"))
        print(format_latency_report(run_latency_bench(out_json=latency_out, progress=progress)))
        written += [out, str(png), latency_out]
    load_out = Path(out).with_name(Path(out).stem + "_load.json")
    devices = load_devices() if args.saturation is None else load_devices(args.saturation)
    if args.device_curve is not None:
        from bench.virtual_clock_load import measured_device

        try:
            devices = measured_device(_device_curve(args.device_curve))
        except BadInput as e:
            return fail(str(e))
    load_rows = run_load_bench(devices=devices, out_json=load_out, progress=progress)
    print(format_load_report(load_rows))
    plot_load(load_rows, load_out.with_suffix(".png"))
    written += [str(load_out), str(load_out.with_suffix(".png"))]
    print(f"wrote {', '.join(written)}")
    return OK


def _device_curve(path: str) -> DeviceCurve:
    """The DeviceCurve JSON at `path` (BadInput naming the file and the bad field)."""
    from pydantic import ValidationError

    from presto_ray.engines.device_curve import DeviceCurve

    try:
        return DeviceCurve.load(path)
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "the curve"
        raise BadInput(f"--device-curve {path}: {field}: {first['msg']}") from None
    except (OSError, ValueError) as e:  # unreadable, or not JSON
        raise BadInput(f"--device-curve {path}: {e}") from None


BENCH_REAL_OUT = "bench/results/vllm_cpu_streaming.json"
BENCH_REAL_PNG = "bench/results/vllm_cpu_streaming.png"


def cmd_bench_real(args: argparse.Namespace) -> int:
    try:
        budgets = _budgets(args.budgets)
    except BadInput as e:
        return fail(str(e))
    if args.n is not None and args.n < 1:
        return fail(f"--n: expected at least 1 prompt, got {args.n}")
    for flag, value in (("--mh-steps", args.mh_steps), ("--block-size", args.block_size)):
        if value is not None and value < (0 if flag == "--mh-steps" else 1):
            return fail(f"{flag}: expected {'0 or more' if flag == '--mh-steps' else 'at least 1'}, got {value}")
    if args.chain_counts is not None:
        return _bench_real_load(args)
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
        _check_prompts(args)
    except BadInput as e:
        return fail(str(e))
    from bench.real import VARIANT_RUNS, format_report, format_samples_check, run_real_bench

    out = args.out or f"bench/results/{Path(args.config).stem}_bench_real.json"
    png = args.png or str(Path(out).with_suffix(".png"))
    return _on_engine(
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


LOGP0_WITH_CONFIG = "--logp0-from is the default vLLM engine's; with --config set engine.logp0_from in the config"


def _check_prompts(args: argparse.Namespace) -> None:
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


def _on_engine(
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


def _bench_real_load(args: argparse.Namespace) -> int:
    """bench-real --chains: every setting at each number of chains in flight at once (bench/real_load.py),
    on --config's engine and sampler, or the default vLLM engine with the sampler's defaults (K 20,
    T 48 unless given); exit 1 where a setting's samples differ from serial's."""
    from presto_ray.cli.common import load_job_config
    from presto_ray.config import SamplerConfig
    from presto_ray.engines.specs import VLLMEngineConfig
    from presto_ray.job import JobConfig

    if args.variants:
        return fail("--variants is the one-chain bench's: --chains runs PowerMH serial, rounds and streaming only")
    if args.early_rejection not in (None, "both"):
        return fail("--early-rejection is the one-chain bench's: --chains runs every setting off and on")
    if args.repeats is not None and args.repeats < 1:
        return fail(f"--repeats: expected at least 1, got {args.repeats}")
    curve = None
    try:
        if args.replay_curve is not None:
            curve = _device_curve(args.replay_curve)
        counts = comma_ints(
            args.chain_counts,
            invalid="--chains: expected comma-separated integers (e.g. 1,4,16,64), got {text!r}",
            below_one="--chains: every number of chains must be at least 1",
        )
        if args.config is not None:
            if args.logp0_from is not None:
                raise BadInput(LOGP0_WITH_CONFIG)
            config, source = load_job_config(args), f"--config {args.config}"
            sampler, mh_steps, block_size = config.sampler, config.sampler.mh_steps, config.sampler.block_size
        else:
            config = JobConfig(engine=VLLMEngineConfig(logp0_from=args.logp0_from or "sampler"))
            sampler, mh_steps, block_size, source = SamplerConfig(), 20, 48, "the default vLLM engine"
        _check_prompts(args)
    except BadInput as e:
        return fail(str(e))
    from bench.real_load import ALL_SETTINGS, SETTINGS, format_report, format_samples_check, run_real_load_bench

    stem = f"{Path(args.config).stem if args.config else 'vllm_cpu'}_load{'_replayed' if curve else ''}"
    out = args.out or f"bench/results/{stem}.json"
    png = args.png or str(Path(out).with_suffix(".png"))

    def on(engine: Engine) -> Engine:
        if curve is None:
            return engine
        from bench.replay import replayed

        block = getattr(config.engine, "kv_block_size", None) or 16
        return replayed(engine, curve, cache_block_size=block, max_running=getattr(config.engine, "max_num_seqs", None))

    return _on_engine(
        args, config, source, out, png,
        lambda engine: run_real_load_bench(
            args.prompts,
            counts,
            on(engine),
            engine_spec=config.engine,
            sampler_config=sampler,
            mh_steps=mh_steps if args.mh_steps is None else args.mh_steps,
            block_size=block_size if args.block_size is None else args.block_size,
            repeats=args.repeats if args.repeats is not None else 2 if curve is None else 1,
            seed=sampler.seed,
            num_prompts=args.n,
            out_json=out,
            out_png=png,
            progress=progress,
            settings=ALL_SETTINGS if args.settings == "all" else SETTINGS,
        ),
        format_report, format_samples_check,
    )  # fmt: skip


def cmd_bench_coordinator(args: argparse.Namespace) -> int:
    invalid = "--chains / --shards: expected comma-separated integers"
    try:
        chains, shards = comma_ints(args.chains, invalid=invalid), comma_ints(args.shards, invalid=invalid)
    except BadInput as e:
        return fail(str(e))
    if any(c < 1 for c in chains + shards):
        return fail("--chains / --shards: every count must be at least 1")
    from bench.coordinator_rate import format_report, run_coordinator_bench

    report = run_coordinator_bench(chains, shards, duration_s=args.duration, out_json=args.out, progress=progress)
    print(format_report(report))
    print(f"wrote {args.out}")
    return OK


def cmd_bench_ray(args: argparse.Namespace) -> int:
    invalid = "--chains / --vllm-chains: expected comma-separated integers"
    try:
        chains = comma_ints(args.chains, invalid=invalid)
        vllm_chains = comma_ints(args.vllm_chains, invalid=invalid) if args.vllm_chains else ()
    except BadInput as e:
        return fail(str(e))
    if any(c < 1 for c in chains + vllm_chains):
        return fail("--chains / --vllm-chains: every count must be at least 1")
    from bench.ray_throughput import format_report, run_ray_bench

    report = run_ray_bench(
        chain_counts=chains,
        vllm_chain_counts=vllm_chains,
        out_json=args.out,
        out_png=args.png,
        progress=progress,
    )
    print(format_report(report))
    print(f"wrote {args.out} and {args.png}")
    return OK


def cmd_load_test(args: argparse.Namespace) -> int:
    try:
        clients = list(comma_ints(args.clients, invalid="--clients must be comma-separated integers, got {text!r}"))
    except BadInput as e:
        return fail(str(e))
    if not clients or min(clients) < 1 or args.duration <= 0 or args.passes < 1:
        return fail("--clients, --duration and --passes must be positive")
    try:
        from bench.load_test import format_report, passed, run_load_test
    except ImportError as e:
        return fail(f"load-test needs Ray Serve and httpx: pip install 'presto-ray[ray,bench]' ({e})")
    report = run_load_test(clients, args.duration, args.passes, args.out, progress=progress)
    print(format_report(report))
    print(f"wrote {args.out}")
    return OK if passed(report) else FAILED


def add_bench(sub: Subparsers) -> None:
    b = sub.add_parser("bench", help="serial vs bfs vs predictive on the toy engine (--virtual-clock: rounds vs streaming)")
    b.add_argument("--budgets", default=None, help="prefetch budgets (default 8,10,12,16,20; --virtual-clock: 8,20)")
    b.add_argument("--chains", type=int, default=8)
    b.add_argument("--mh-steps", type=int, default=None, dest="mh_steps_given", help="MH steps per block (default 100; --host-time: 25)")
    b.add_argument("--block-size", type=int, default=None, dest="block_size_given", help="block size (default 64; --host-time: 48)")
    b.add_argument("--out", default=None, help="JSON output (default bench/results/toy.json, virtual_clock.json or host_time.json)")
    b.add_argument(
        "--host-time", action="store_true",
        help="CPU time of the control plane per generated token on the toy engine: serial, rounds and streaming, "
        "early rejection off and on, at --chain-counts chains (configs/toy.yaml's sampler; bench/results/host_time.json)",
    )
    b.add_argument("--chain-counts", default="1,4,16", help="--host-time: chain counts (default 1,4,16; up to 256)")
    b.add_argument("--profile", action="store_true", help="--host-time: also each setting's time by part (cProfile)")
    b.add_argument(
        "--virtual-clock", action="store_true",
        help="serial vs rounds vs streaming in decode steps on the toy's continuous-batching clock: one chain per "
        "device (--out, a JSON list of rows) and 1, 8, 64 chains sharing one device, 1, 8, 64, 256 on a "
        "saturating one (*_load.json, *_load.png)",
    )
    b.add_argument(
        "--load-only", action="store_true",
        help="--virtual-clock: only the load table (*_load.json and *_load.png beside --out)",
    )
    b.add_argument(
        "--saturation", type=float, default=None,
        help="--virtual-clock: running sequences at which the saturating device's decode step stops being free "
        "(n_sat: a step costs max(1, running / n_sat); default 32)",
    )
    b.add_argument(
        "--device-curve", default=None,
        help="--virtual-clock: the load table on a measured device instead of the analytic ones: a JSON "
        "DeviceCurve (batch_sizes, step_time_s, prefill and host costs; presto_ray/engines/device_curve.py); "
        "time is then in seconds",
    )
    b.set_defaults(func=cmd_bench)


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


def add_load_test(sub: Subparsers) -> None:
    lt = sub.add_parser(
        "load-test", help="a bounded load test of the HTTP service on 127.0.0.1 (toy engine; stops by itself)"
    )
    lt.add_argument("--clients", default="8,32,128", help="concurrent clients per round (default 8,32,128)")
    lt.add_argument("--duration", type=float, default=10.0, help="seconds each round sends requests (default 10)")
    lt.add_argument("--passes", type=int, default=2, help="times over the client counts (memory must stay flat)")
    lt.add_argument("--out", default="bench/results/load_test.json", help="JSON report")
    lt.set_defaults(func=cmd_load_test)


def add_bench_ray(sub: Subparsers) -> None:
    y = sub.add_parser("bench-ray", help="Ray throughput against concurrent chains (toy latency model, vLLM)")
    y.add_argument("--chains", default="1,2,4,8,16,32,64", help="chain counts on the toy engine")
    y.add_argument("--vllm-chains", default="", help="chain counts on vLLM (CPU), e.g. 1,2,4,8,16")
    y.add_argument("--out", default="bench/results/ray.json")
    y.add_argument("--png", default="bench/results/ray.png")
    y.set_defaults(func=cmd_bench_ray)


def add_bench_coordinator(sub: Subparsers) -> None:
    b = sub.add_parser("bench-coordinator", help="requests per second through 1, 2, 4 coordinator shards (toy engine)")
    b.add_argument("--chains", default="64,256,1024", help="concurrent simulated chains")
    b.add_argument("--shards", default="1,2,4", help="coordinator shard counts")
    b.add_argument("--duration", type=float, default=5.0, help="seconds each setting runs")
    b.add_argument("--out", default="bench/results/coordinator_rate.json")
    b.set_defaults(func=cmd_bench_coordinator)


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


COMMANDS = {
    "bench": add_bench,
    "bench-real": add_bench_real,
    "load-test": add_load_test,
    "bench-ray": add_bench_ray,
    "bench-coordinator": add_bench_coordinator,
    "bench-early-rejection": add_bench_early_rejection,
}
