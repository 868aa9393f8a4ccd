"""Ray throughput against the number of concurrent chains: `presto-ray bench-ray`.

For each chain count the same job runs twice, side by side on this machine:
  - in-process: `sample_many`, every round of all chains in one call with no coordination: the
    engine's own throughput for this workload;
  - on Ray: the Ray Data job's power-sampling stage (`deployments/processor.py`: its actor pool, the
    coordinator and one engine replica) over the prompts as a Dataset; the coordinator and the
    replica are started before the clock, the stage's actors (Ray Data starts them per job) after.
The share column is Ray's transitions per second over the in-process figure. Both runs draw the
same samples (keyed randomness), which the bench checks.

Engines: the toy with a latency model (each call sleeps a fixed time plus a cost per generated
token, like a GPU serving one batch) and, with --vllm, vLLM on the CPU with SmolLM2-135M.
A second table measures the batching policy (window and calls in flight) at one chain count.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from bench.plots import save_figure
from bench.table import Columns, format_table
from presto_ray import __version__
from presto_ray.engines import EngineConfig, build_engine
from presto_ray.engines.base import Engine
from presto_ray.job import JobConfig, run_job
from presto_ray.output import write_json_atomic
from presto_ray.prompts import PromptItem

if TYPE_CHECKING:
    from actors.cluster import SamplingCluster
    from actors.coordinator_stats import CoordinatorSnapshot
    from actors.engine_replica import ReplicaHandle

E = TypeVar("E", bound=Engine)

TOY_LATENCY = {"call_latency_s": 0.05, "token_latency_s": 2e-5}
COLUMNS: Columns = [
    ("engine", "engine", "{}"),
    ("chains", "chains", "{}"),
    ("ray_transitions_per_s", "Ray trans/s", "{:.1f}"),
    ("local_transitions_per_s", "in-proc trans/s", "{:.1f}"),
    ("share_of_engine", "share", "{:.2f}"),
    ("ray_job_wall_s", "Ray job s", "{:.1f}"),
    ("ray_calls", "Ray calls", "{}"),
    ("local_calls", "in-proc calls", "{}"),
    ("requests_per_call", "req/call", "{:.1f}"),
    ("transitions_per_call", "trans/call", "{:.2f}"),
    ("cached_token_share", "cached", "{:.2f}"),
    ("same_samples", "same", "{}"),
]
POLICY_COLUMNS: Columns = [
    ("batch_window_ms", "window ms", "{:g}"),
    ("max_inflight_calls", "in flight", "{}"),
    ("chains", "chains", "{}"),
    ("ray_transitions_per_s", "trans/s", "{:.1f}"),
    ("ray_calls", "calls", "{}"),
    ("requests_per_call", "req/call", "{:.1f}"),
    ("same_samples", "same", "{}"),
]


def _items(chains: int) -> tuple[list[PromptItem], int]:
    prompts = min(chains, 4)  # several chains per prompt, as in real jobs
    items = [PromptItem(id=f"p{i}", prompt=f"Question {i}: name a prime number above {10 * i}.") for i in range(prompts)]
    return items, chains // prompts


def _job_config(engine: dict, sampler: dict, chains: int, ray: dict) -> tuple[list[PromptItem], JobConfig]:
    items, per_prompt = _items(chains)
    config = JobConfig.model_validate(
        {"engine": engine, "sampler": sampler, "chains_per_prompt": per_prompt, "max_active_chains": chains, "ray": ray}
    )
    return items, config


def _ray_run(
    items: list[PromptItem], config: JobConfig, replicas: list[ReplicaHandle]
) -> tuple[list[dict], CoordinatorSnapshot, float]:
    """The job through the Ray Data stage on running `replicas`: its rows, the coordinator's
    snapshot and the wall time of the Dataset's execution (the stage's actor start-up included)."""
    import ray.data

    from deployments.processor import build_power_sampling_processor

    rows = [{"id": item.id, "prompt": item.prompt} for item in items]
    # one batch per prompt, every prompt's batch running at once: all chains share each call
    with build_power_sampling_processor(config, replicas=replicas, batch_size=1, batches_per_actor=len(items)) as processor:
        start = time.perf_counter()
        out = processor(ray.data.from_items(rows)).take_all()
        wall = time.perf_counter() - start
        snapshot = processor.snapshot()
    errors = [r["error"] for r in out if r["error"] is not None]
    if errors:
        raise RuntimeError(f"the Ray job wrote errors: {errors[:3]}")
    return out, snapshot, wall


def _samples(rows: list[dict]) -> dict:
    return {(r["prompt_id"], r["chain"]): list(r["token_ids"]) for r in rows}


def measure(
    engine_spec: dict, sampler: dict, chains: int, ray: dict, replicas: list[ReplicaHandle], local_engine: Engine | None = None
) -> dict:
    """One row: the same job on Ray (on running `replicas`) and in-process (when `local_engine` is given)."""
    items, config = _job_config(engine_spec, sampler, chains, ray)
    rows, snapshot, job_time = _ray_run(items, config, replicas)
    # the chains' span: every batch starts once the stage's actor is up, so the longest chain's
    # wall time is the time the chains ran; the job's wall time adds the actors' start-up (seconds,
    # whatever the work), which would make this a measure of Ray Data's start-up on small jobs
    ray_time = max(r["wall_time_s"] for r in rows)
    engine = snapshot.accounting
    calls, transitions = engine.calls, sum(r["transitions"] for r in rows)
    row = {
        "engine": engine_spec["kind"],
        "chains": chains,
        "batch_window_ms": config.ray.batch_window_s * 1000,
        "max_inflight_calls": config.ray.max_inflight_calls,
        "ray_wall_s": ray_time,
        "ray_job_wall_s": job_time,
        "ray_calls": calls,
        "transitions": transitions,
        "ray_transitions_per_s": transitions / ray_time,
        "requests_per_call": engine.num_requests / calls,
        "transitions_per_call": transitions / calls,
        "cached_token_share": engine.cached_prompt_tokens / max(engine.prompt_tokens, 1),
        "engine_time_s": engine.wall_time_s,
    }
    if local_engine is not None:
        start = time.perf_counter()
        local = run_job(items, config, local_engine)
        local_time = time.perf_counter() - start
        row.update(
            local_wall_s=local_time,
            local_calls=local.engine.calls,
            local_transitions_per_s=local.chains.transitions / local_time,
            share_of_engine=(transitions / ray_time) / (local.chains.transitions / local_time),
            same_samples=_samples(local.rows) == _samples(rows),
        )
    return row


def _engines(engine_spec: dict, sampler: dict, build: Callable[[EngineConfig], E]) -> tuple[E, SamplingCluster]:
    """The in-process engine and a cluster with one Ray replica of the same spec, both warmed up on
    every prompt (vLLM's first calls and cold prefix caches must not count against either side).
    Each measured job runs its own coordinator and stage actors on the cluster's replicas."""
    from actors.cluster import SamplingCluster

    items, config = _job_config(engine_spec, sampler, 4, {})
    engine = build(config.engine)
    cluster = SamplingCluster(config.engine, config.ray)
    run_job(items, config, engine)
    _ray_run(items, config, cluster.replicas)
    return engine, cluster


def run_ray_bench(
    *,
    chain_counts: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    vllm_chain_counts: Sequence[int] = (),
    policy_chains: int = 16,  # 0: skip the batching-policy table
    out_json: str | Path | None = None,
    out_png: str | Path | None = None,
    progress: Callable[[str], None] = print,
) -> dict:
    from actors.cluster import ensure_ray

    ensure_ray()
    toy = {"kind": "toy", "vocab_size": 64, "logit_scale": 4.0, "eos_bias": -3.0, **TOY_LATENCY}
    # rounds: this bench measures how the coordinator merges calls (streaming makes none)
    toy_sampler = {"block_size": 32, "num_blocks": 1, "mh_steps": 30, "prefetch_budget": 8, "seed": 0, "schedule": "rounds"}
    rows, policy = [], []
    toy_engine, toy_cluster = _engines(toy, toy_sampler, build_engine)
    toy_replicas = toy_cluster.replicas
    for chains in chain_counts:
        rows.append(measure(toy, toy_sampler, chains, {}, toy_replicas, toy_engine))
        progress(f"toy chains={chains}: share {rows[-1]['share_of_engine']:.2f}, {rows[-1]['requests_per_call']:.1f} req/call")
    for window in (0.0, 0.02, 0.05, 0.1, 0.2) if policy_chains else ():
        for inflight in (1, 2):
            ray = {"batch_window_s": window, "max_inflight_calls": inflight}
            policy.append(measure(toy, toy_sampler, policy_chains, ray, toy_replicas, toy_engine))
            progress(f"policy window={window} inflight={inflight}: {policy[-1]['ray_transitions_per_s']:.1f} trans/s")
    toy_cluster.shutdown()
    vllm_sampler = {"block_size": 24, "num_blocks": 1, "mh_steps": 6, "prefetch_budget": 4, "seed": 0, "schedule": "rounds"}
    model_dir = None
    if vllm_chain_counts:
        from presto_ray.engines.vllm import VLLMEngine

        engine, cluster = _engines({"kind": "vllm"}, vllm_sampler, lambda _: VLLMEngine())
        with engine:
            model_dir = engine.model_dir
            for chains in vllm_chain_counts:
                rows.append(measure({"kind": "vllm"}, vllm_sampler, chains, {}, cluster.replicas, engine))
                progress(f"vllm chains={chains}: share {rows[-1]['share_of_engine']:.2f}")
        cluster.shutdown()
    report = {
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": {
            "presto_ray_version": __version__,
            "toy_engine": toy,
            "toy_sampler": toy_sampler,
            "vllm_sampler": vllm_sampler,
            "vllm_model_dir": model_dir,
            "ray_defaults": JobConfig().ray.model_dump(),
            "replicas": 1,
            "ray_job": "the Ray Data stage (deployments.processor), one batch per prompt",
            "ray_time": "ray_wall_s: the longest chain's wall time (the chains' span); ray_job_wall_s: the "
            "Dataset's execution, the stage's actor start-up included",
            "prompts": "min(chains, 4) prompts, chains / prompts chains each",
        },
        "rows": rows,
        "policy": policy,
    }
    if out_json:
        write_json_atomic(report, out_json)
    if out_png:
        plot(report, out_png)
    return report


def format_report(report: dict) -> str:
    return (
        format_table(report["rows"], COLUMNS)
        + "\n\nbatching policy (toy):\n"
        + format_table(report["policy"], POLICY_COLUMNS)
    )


def plot(report: dict, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines = sorted({r["engine"] for r in report["rows"]})
    fig, axes = plt.subplots(1, len(engines), figsize=(5 * len(engines), 4), squeeze=False)
    for ax, engine in zip(axes[0], engines):
        rows = [r for r in report["rows"] if r["engine"] == engine]
        chains = [r["chains"] for r in rows]
        ax.plot(chains, [r["ray_transitions_per_s"] for r in rows], marker="o", label="Ray (coordinator)")
        ax.plot(chains, [r["local_transitions_per_s"] for r in rows], marker="s", label="in-process (engine bound)")
        ax.set(xscale="log", xlabel="concurrent chains", ylabel="MH transitions per second", title=engine)
        ax.set_xticks(chains, [str(c) for c in chains])
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("presto-ray throughput against concurrent chains (one replica)")
    save_figure(fig, path, dpi=120)
