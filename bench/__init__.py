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
- `table`: the plain-text tables all three print.
- `commands`: the five benchmark subcommands of `presto-ray` (bench, bench-real, bench-coordinator,
  bench-ray, load-test): their arguments and handlers, registered by presto_ray/cli.
"""
