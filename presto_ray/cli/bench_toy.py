"""`presto-ray bench`: the schedules on the toy engine (bench/toy.py), the control plane's CPU time
per token (--host-time: bench/host_time.py) and the continuous-batching clock (--virtual-clock:
bench/virtual_clock.py and virtual_clock_load.py), each imported only when it runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from presto_ray.cli.bench_common import load_device_curve, parse_budgets
from presto_ray.cli.common import FAILED, OK, BadInput, Subparsers, comma_ints, fail, progress


def cmd_bench(args: argparse.Namespace) -> int:
    if args.virtual_clock:
        return _bench_virtual_clock(args)
    if args.host_time:
        return _bench_host_time(args)
    from bench.toy import format_report, run_toy_bench

    args.out = args.out or "bench/results/toy.json"
    try:
        budgets = parse_budgets(args.budgets or "8,10,12,16,20")
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
        budgets = parse_budgets(args.budgets or "8,20")
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
            devices = measured_device(load_device_curve(args.device_curve))
        except BadInput as e:
            return fail(str(e))
    load_rows = run_load_bench(devices=devices, out_json=load_out, progress=progress)
    print(format_load_report(load_rows))
    plot_load(load_rows, load_out.with_suffix(".png"))
    written += [str(load_out), str(load_out.with_suffix(".png"))]
    print(f"wrote {', '.join(written)}")
    return OK


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


COMMANDS = {"bench": add_bench}
