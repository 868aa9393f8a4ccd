"""The benchmarks of the Ray side: `presto-ray bench-ray` (throughput against concurrent chains:
bench/ray_throughput.py), `bench-coordinator` (the coordinator's requests per second per number
of shards: bench/coordinator_rate.py) and `load-test` (the HTTP service on Ray Serve:
bench/load_test.py), each imported only when it runs."""

from __future__ import annotations

import argparse

from presto_ray.cli.common import FAILED, OK, BadInput, Subparsers, comma_ints, fail, progress


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


def add_bench_ray(sub: Subparsers) -> None:
    y = sub.add_parser("bench-ray", help="Ray throughput against concurrent chains (toy latency model, vLLM)")
    y.add_argument("--chains", default="1,2,4,8,16,32,64", help="chain counts on the toy engine")
    y.add_argument("--vllm-chains", default="", help="chain counts on vLLM (CPU), e.g. 1,2,4,8,16")
    y.add_argument("--out", default="bench/results/ray.json")
    y.add_argument("--png", default="bench/results/ray.png")
    y.set_defaults(func=cmd_bench_ray)


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


def add_bench_coordinator(sub: Subparsers) -> None:
    b = sub.add_parser("bench-coordinator", help="requests per second through 1, 2, 4 coordinator shards (toy engine)")
    b.add_argument("--chains", default="64,256,1024", help="concurrent simulated chains")
    b.add_argument("--shards", default="1,2,4", help="coordinator shard counts")
    b.add_argument("--duration", type=float, default=5.0, help="seconds each setting runs")
    b.add_argument("--out", default="bench/results/coordinator_rate.json")
    b.set_defaults(func=cmd_bench_coordinator)


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


def add_load_test(sub: Subparsers) -> None:
    lt = sub.add_parser(
        "load-test", help="a bounded load test of the HTTP service on 127.0.0.1 (toy engine; stops by itself)"
    )
    lt.add_argument("--clients", default="8,32,128", help="concurrent clients per round (default 8,32,128)")
    lt.add_argument("--duration", type=float, default=10.0, help="seconds each round sends requests (default 10)")
    lt.add_argument("--passes", type=int, default=2, help="times over the client counts (memory must stay flat)")
    lt.add_argument("--out", default="bench/results/load_test.json", help="JSON report")
    lt.set_defaults(func=cmd_load_test)


COMMANDS = {
    "bench-ray": add_bench_ray,
    "bench-coordinator": add_bench_coordinator,
    "load-test": add_load_test,
}
