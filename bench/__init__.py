"""Benchmarks, kept out of the library: each writes a JSON report into bench/results/.

- `toy`: serial PowerMH against bfs and predictive prefetching (and the EntropyCut and
  MultiTryMH variants) on the toy engine: model calls, transitions per call, requests used,
  and that every schedule draws the serial chain's samples (`presto-ray bench`).
- `real`: the same comparison on vLLM with the real model: wall-time speedup over serial,
  seconds per call, prefix-cache share, scoring share (`presto-ray bench-real`).
- `ray_throughput`: transitions per second on Ray (the Ray Data job's sampling stage, the
  coordinator, one engine replica) against the same job in-process, per number of concurrent
  chains, and the batching policy's effect (`presto-ray bench-ray`).
- `ray_data`: the Ray Data job's rows per second and engine calls, and its driver's memory.
- `virtual_clock` (one chain per device, latency) and `virtual_clock_load` (many chains on one
  device, analytic or measured), `early_rejection`, `coordinator_rate`, `load_test` (with `load_clients` and
  `service_watch`), `plots`: the virtual-clock tables, the early-rejection replay, the
  coordinator's rate, the HTTP load test and soak, the shared plot helper.
- Their subcommands (bench, bench-real, bench-ray, bench-coordinator, load-test,
  bench-early-rejection) are the command line's: presto_ray/cli/bench_toy.py, bench_real.py
  (with bench_real_load.py, bench_real_engine.py), bench_ray.py, bench_early_rejection.py and
  their shared bench_common.py. Nothing here imports the command line.
"""
