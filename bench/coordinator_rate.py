"""How many requests per second coordinators pass: `presto-ray bench-coordinator`.

Load actors keep `chains` simulated chains busy: each submits a round of `requests_per_round`
distinct one-token requests to its prompt's coordinator shard, waits for the completions and
submits again, for `duration_s`. Engine replicas are toy engines with no latency, so what is
measured is the Ray path (submit, dedup, routing, batching, replica calls, fan-out), not a model.
Every figure is wall clock on this machine, where load actors, coordinators and replicas share its
cores: shards can only add throughput where there are cores to run them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

import ray

from actors.cluster import SamplingCluster
from actors.coordinator_shards import CoordinatorShards
from actors.handles import kill_actor, remote_method
from bench.table import Columns, format_table
from presto_ray import __version__
from presto_ray.engines import ToyEngineConfig
from presto_ray.engines.base import ProposalRequest
from presto_ray.output import write_json_atomic
from presto_ray.ray_config import RayConfig

COLUMNS: Columns = [
    ("shards", "shards", "{}"),
    ("chains", "chains", "{}"),
    ("requests_per_s", "requests/s", "{:.0f}"),
    ("rounds_per_s", "rounds/s", "{:.0f}"),
    ("speedup", "vs 1 shard", "{:.2f}"),
    ("calls", "calls", "{}"),
    ("requests_per_call", "req/call", "{:.1f}"),
]


class SubmitLoad:
    """Simulated chains: submit a round, await it, submit the next, until the deadline."""

    def __init__(self, coordinators: CoordinatorShards) -> None:
        self.coordinators = coordinators

    @remote_method
    def ready(self) -> bool:
        return True

    @remote_method
    async def run(self, chain_ids: list[int], duration_s: float, requests_per_round: int) -> tuple[int, int]:
        deadline = time.monotonic() + duration_s
        totals = [0, 0]  # requests, rounds

        async def chain(c: int) -> None:
            prompt = (3, 1 + c % 40, 1 + (c // 40) % 40, 5)  # distinct prompts: spread over shards and replicas
            coordinator, step = self.coordinators.for_prompt(prompt), 0
            while time.monotonic() < deadline:
                round_ = [ProposalRequest(prompt, (), 1, 1.0, seed=step * requests_per_round + k) for k in range(requests_per_round)]
                await coordinator.submit.remote(("load", c), round_)
                totals[0] += len(round_)
                totals[1] += 1
                step += 1
            await coordinator.chain_finished.remote(("load", c))

        await asyncio.gather(*(chain(c) for c in chain_ids))
        return totals[0], totals[1]


def measure(shards: int, chains: int, *, duration_s: float, requests_per_round: int, load_actors: int) -> dict:
    settings = RayConfig(num_replicas=4, coordinator_shards=shards, batch_window_s=0.01, max_batch_wait_s=0.05)
    cluster = SamplingCluster(ToyEngineConfig(vocab_size=64), settings)
    try:
        remote = ray.remote(SubmitLoad).options(num_cpus=0, max_concurrency=4)
        loads = [remote.remote(cluster.coordinators) for _ in range(load_actors)]
        ray.get([a.ready.remote() for a in loads])  # worker start-up is not timed
        ids = list(range(chains))
        start = time.perf_counter()
        done = ray.get([a.run.remote(ids[i::load_actors], duration_s, requests_per_round) for i, a in enumerate(loads)])
        elapsed = time.perf_counter() - start
        snapshot = cluster.snapshot()
        for actor in loads:
            kill_actor(actor)
    finally:
        cluster.shutdown()
    requests, rounds = map(sum, zip(*done))
    assert snapshot.counters.submitted_requests == requests, "the coordinators must count every request sent"
    return {
        "shards": shards,
        "chains": chains,
        "requests": requests,
        "requests_per_s": requests / elapsed,
        "rounds_per_s": rounds / elapsed,
        "calls": snapshot.accounting.calls,
        "requests_per_call": snapshot.requests_per_call,
        "wall_s": elapsed,
    }


def run_coordinator_bench(
    chain_counts: Sequence[int] = (64, 256, 1024),
    shard_counts: Sequence[int] = (1, 2, 4),
    *,
    duration_s: float = 5.0,
    requests_per_round: int = 4,
    load_actors: int = 4,
    out_json: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(log_to_driver=False)
    cpus = ray.cluster_resources().get("CPU")
    try:
        rows = []
        for chains in chain_counts:
            base = None
            for shards in shard_counts:
                row = measure(shards, chains, duration_s=duration_s, requests_per_round=requests_per_round, load_actors=load_actors)
                base = base or row["requests_per_s"]
                row["speedup"] = row["requests_per_s"] / base
                rows.append(row)
                if progress:
                    progress(format_table([row], COLUMNS).splitlines()[-1])
    finally:
        if started_ray:
            ray.shutdown()
    report = {
        "version": __version__,
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "clock": "wall",
        "cpus": cpus,
        "duration_s": duration_s,
        "requests_per_round": requests_per_round,
        "load_actors": load_actors,
        "rows": rows,
    }
    if out_json:
        write_json_atomic(report, out_json)
    return report


def format_report(report: dict) -> str:
    return format_table(report["rows"], COLUMNS)
