"""Real-model benchmark: serial PowerMH vs rounds vs streaming on vLLM, side by side, same seeds.

For each prompt the runs go back to back on one engine (interleaved, so drift in machine load
hits all of them alike); wall time is measured around each sample, and ratios are taken against
serial on the same prompts and seeds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

from bench.plots import save_figure
from bench.table import Columns, format_table
from presto_ray import __version__
from presto_ray.config import SamplerConfig
from presto_ray.driver import sample_many
from presto_ray.engines.vllm import VLLMEngine, VLLMEngineConfig
from presto_ray.job import encode_prompt
from presto_ray.output import write_json_atomic
from presto_ray.prompts import read_prompts

COLUMNS: Columns = [
    ("sampler", "sampler", "{}"),
    ("traversal", "traversal", "{}"),
    ("schedule", "schedule", "{}"),
    ("budget", "N_pf", "{}"),
    ("wall_time_s", "wall s", "{:.1f}"),
    ("speedup_vs_serial", "speedup", "{:.2f}x"),
    ("requests_per_sample", "req/sample", "{:.1f}"),
    ("calls_per_sample", "calls/sample", "{:.1f}"),
    ("transitions_per_second", "trans/s", "{:.2f}"),
    ("generated_tokens_per_sample", "gen tok/sample", "{:.0f}"),
    ("aborted_per_sample", "aborted/sample", "{:.1f}"),
    ("forked_per_sample", "forked/sample", "{:.1f}"),
    ("cached_token_share", "cached share", "{:.1%}"),
    ("acceptance_rate", "accept", "{:.1%}"),
    ("same_as_serial", "same as serial", "{}"),
]

Run = tuple[str, str, int, str]  # (sampler, traversal, prefetch budget, schedule)
SERIAL: Run = ("power_mh", "serial", 1, "rounds")

VARIANT_RUNS: list[Run] = [
    ("power_mh", "serial", 1, "rounds"), ("power_mh", "predictive", 8, "rounds"), ("power_mh", "predictive", 8, "streaming"),
    ("entropy_cut", "serial", 1, "rounds"), ("entropy_cut", "predictive", 8, "streaming"),
    ("multi_try", "serial", 1, "rounds"), ("multi_try", "predictive", 12, "streaming"),
]  # fmt: skip
NUM_TRIES = 3


def default_runs(budgets: Sequence[int]) -> list[Run]:
    """Serial PowerMH, then predictive rounds and streaming at each budget."""
    return [SERIAL] + [("power_mh", "predictive", b, schedule) for b in budgets for schedule in ("rounds", "streaming")]


def run_real_bench(
    prompts_path: str | Path,
    budgets: Sequence[int] = (4, 8, 16),
    runs: Sequence[Run] | None = None,
    mh_steps: int = 20,
    block_size: int = 48,
    seed: int = 0,
    engine_config: VLLMEngineConfig | None = None,
    out_json: str | Path | None = None,
    out_png: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Each run is (sampler, traversal, budget, schedule); by default `default_runs(budgets)`."""
    items = read_prompts(prompts_path)
    runs = list(runs or default_runs(budgets))
    engine = VLLMEngine(engine_config)
    try:
        prompts = [encode_prompt(engine.tokenizer, item) for item in items]
        base = SamplerConfig(block_size=block_size, mh_steps=mh_steps, num_blocks=1)
        per_run: dict[Run, list] = {run: [] for run in runs}
        for p, item in enumerate(items):
            for run in runs:
                sampler, traversal, budget, schedule = run
                update = {"sampler": sampler, "traversal": traversal, "prefetch_budget": budget, "seed": seed + p, "schedule": schedule}
                if sampler == "multi_try":
                    update["num_tries"] = NUM_TRIES
                started = time.perf_counter()
                results, accounting = sample_many(engine, [prompts[p]], [base.model_copy(update=update)])
                wall = time.perf_counter() - started
                per_run[run].append((results[0], accounting, wall))
                if progress:
                    progress(f"{item.id} {sampler} {traversal} {schedule} N_pf={budget}: {results[0].stats.requests} requests, {wall:.1f} s")
        rows = [_row(run, per_run[run], per_run[(run[0], "serial", 1, "rounds")]) for run in runs]
        report = {
            "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "config": {
                "presto_ray_version": __version__,
                "engine": engine.config.model_dump(),
                "model_dir": engine.model_dir,
                "engine_startup_s": round(engine.startup_time_s, 1),
                "prompts": [item.id for item in items],
                "sampler": base.model_dump(exclude={"traversal", "prefetch_budget", "seed", "sampler", "num_tries", "schedule"}),
                "multi_try_num_tries": NUM_TRIES,
                "seeds": "seed + prompt index",
                "wall_time": "measured around each sample, engine start excluded",
            },
            "rows": rows,
        }
    finally:
        engine.shutdown()
    if out_json:
        write_json_atomic(report, out_json)
    if out_png:
        plot(report, out_png)
    return report


def _row(run: Run, runs: list, serial: list) -> dict:
    sampler, traversal, budget, schedule = run
    n = len(runs)

    def stat(of, field):
        return sum(getattr(result.stats, field) for result, _, _ in of)

    def engine(field):
        return sum(getattr(accounting, field) for _, accounting, _ in runs)

    wall = sum(w for _, _, w in runs)
    transitions = stat(runs, "transitions")
    return {
        "sampler": sampler,
        "traversal": traversal,
        "schedule": schedule,
        "budget": budget,
        "wall_time_s": wall,
        "speedup_vs_serial": sum(w for _, _, w in serial) / wall,
        "requests_per_sample": stat(runs, "requests") / n,
        "calls_per_sample": engine("calls") / n,  # streaming makes no batched calls
        "transitions_per_second": transitions / wall,
        "generated_tokens_per_sample": engine("generated_tokens") / n,  # aborted requests' tokens included
        "aborted_per_sample": stat(runs, "aborted_requests") / n,
        "forked_per_sample": stat(runs, "forked_requests") / n,
        "cached_token_share": engine("cached_prompt_tokens") / max(engine("prompt_tokens"), 1),
        "acceptance_rate": stat(runs, "accepted") / max(transitions, 1),
        "same_as_serial": all(r.token_ids == s.token_ids for (r, _, _), (s, _, _) in zip(runs, serial)),
    }


def plot(report: dict, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["rows"] if r["sampler"] == "power_mh" and r["traversal"] != "serial"]
    if len({r["budget"] for r in rows}) < 2:
        return  # a variants run has no budget sweep to plot
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for schedule, marker in (("rounds", "o"), ("streaming", "s")):
        picked = [r for r in rows if r["schedule"] == schedule]
        budgets = [r["budget"] for r in picked]
        axes[0].plot(budgets, [r["speedup_vs_serial"] for r in picked], marker=marker, label=schedule)
        axes[1].plot(budgets, [r["generated_tokens_per_sample"] for r in picked], marker=marker, label=schedule)
    serial = next(r for r in report["rows"] if r["traversal"] == "serial" and r["sampler"] == "power_mh")
    axes[0].axhline(1.0, color="grey", lw=0.8, ls="--", label="serial")
    axes[1].axhline(serial["generated_tokens_per_sample"], color="grey", lw=0.8, ls="--", label="serial")
    axes[0].set(xlabel="prefetch budget N_pf", ylabel="wall-time speedup vs serial", title="Speedup (same samples)")
    axes[1].set(xlabel="prefetch budget N_pf", ylabel="tokens generated per sample", title="Tokens (aborted included)")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(f"presto-ray on vLLM (CPU), {Path(report['config']['model_dir']).name}")
    save_figure(fig, path)


def format_report(report: dict) -> str:
    return format_table(report["rows"], COLUMNS)
