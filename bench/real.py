"""Real-model benchmark: serial PowerMH vs bfs vs predictive on vLLM, side by side, same seeds.

For each prompt the traversals run back to back on one engine (interleaved, so drift in machine
load hits all of them alike); ratios are taken against serial on the same prompts and seeds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

from bench.table import Columns, format_table
from presto_ray import __version__
from presto_ray.config import SamplerConfig
from presto_ray.driver import sample_many
from presto_ray.engines.vllm_engine import VLLMEngine, VLLMEngineConfig
from presto_ray.job import encode_prompt
from presto_ray.output import write_json_atomic
from presto_ray.prompts import read_prompts

COLUMNS: Columns = [
    ("sampler", "sampler", "{}"),
    ("traversal", "traversal", "{}"),
    ("budget", "N_pf", "{}"),
    ("wall_time_s", "wall s", "{:.1f}"),
    ("speedup_vs_serial", "speedup", "{:.2f}x"),
    ("calls_per_sample", "calls/sample", "{:.1f}"),
    ("transitions_per_call", "trans/call", "{:.2f}"),
    ("seconds_per_call", "s/call", "{:.2f}"),
    ("generated_tokens_per_sample", "gen tok/sample", "{:.0f}"),
    ("cached_token_share", "cached share", "{:.1%}"),
    ("scoring_time_share", "scoring share", "{:.1%}"),
    ("acceptance_rate", "accept", "{:.1%}"),
    ("same_as_serial", "same as serial", "{}"),
]


VARIANT_RUNS = [
    ("power_mh", "serial", 1), ("power_mh", "predictive", 8),
    ("entropy_cut", "serial", 1), ("entropy_cut", "predictive", 8),
    ("multi_try", "serial", 1), ("multi_try", "predictive", 12),
]
NUM_TRIES = 3


def run_real_bench(
    prompts_path: str | Path,
    budgets: Sequence[int] = (4, 8, 16),
    runs: Sequence[tuple[str, str, int]] | None = None,
    mh_steps: int = 20,
    block_size: int = 48,
    seed: int = 0,
    engine_config: VLLMEngineConfig | None = None,
    out_json: str | Path | None = None,
    out_png: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Each run is (sampler, traversal, budget); by default PowerMH serial, bfs and predictive."""
    items = read_prompts(prompts_path)
    runs = list(runs or [("power_mh", "serial", 1)] + [("power_mh", t, b) for b in budgets for t in ("bfs", "predictive")])
    engine = VLLMEngine(engine_config)
    try:
        prompts = [encode_prompt(engine.tokenizer, item) for item in items]
        base = SamplerConfig(block_size=block_size, mh_steps=mh_steps, num_blocks=1)
        per_run: dict[tuple[str, str, int], list] = {run: [] for run in runs}
        for p, item in enumerate(items):
            for sampler, traversal, budget in runs:
                update = {"sampler": sampler, "traversal": traversal, "prefetch_budget": budget, "seed": seed + p}
                if sampler == "multi_try":
                    update["num_tries"] = NUM_TRIES
                results, accounting = sample_many(engine, [prompts[p]], [base.model_copy(update=update)])
                per_run[(sampler, traversal, budget)].append((results[0], accounting))
                if progress:
                    progress(f"{item.id} {sampler} {traversal} N_pf={budget}: {accounting.calls} calls, {accounting.wall_time_s:.1f} s")
        rows = [_row(*run, per_run[run], per_run[(run[0], "serial", 1)]) for run in runs]
        report = {
            "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "config": {
                "presto_ray_version": __version__,
                "engine": engine.config.model_dump(),
                "model_dir": engine.model_dir,
                "engine_startup_s": round(engine.startup_time_s, 1),
                "prompts": [item.id for item in items],
                "sampler": base.model_dump(exclude={"traversal", "prefetch_budget", "seed", "sampler", "num_tries"}),
                "multi_try_num_tries": NUM_TRIES,
                "seeds": "seed + prompt index",
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


def _row(sampler: str, traversal: str, budget: int, runs: list, serial: list) -> dict:
    def total(of, field):
        return sum(getattr(acc, field) for _, acc in of)

    def stat(of, field):
        return sum(getattr(result.stats, field) for result, _ in of)

    calls, wall = total(runs, "calls"), total(runs, "wall_time_s")
    transitions = stat(runs, "transitions")
    return {
        "sampler": sampler,
        "traversal": traversal,
        "budget": budget,
        "wall_time_s": wall,
        "speedup_vs_serial": total(serial, "wall_time_s") / wall,
        "calls_per_sample": calls / len(runs),
        "transitions_per_call": transitions / calls,
        "seconds_per_call": wall / calls,
        "generated_tokens_per_sample": total(runs, "generated_tokens") / len(runs),
        "cached_token_share": total(runs, "cached_prompt_tokens") / max(total(runs, "prompt_tokens"), 1),
        "scoring_time_share": total(runs, "scoring_time_s") / wall,
        "acceptance_rate": stat(runs, "accepted") / max(transitions, 1),
        "same_as_serial": all(r.token_ids == s.token_ids for (r, _), (s, _) in zip(runs, serial)),
    }


def plot(report: dict, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["rows"] if r["sampler"] == "power_mh"]
    if not any(r["traversal"] == "bfs" for r in rows):
        return  # a variants run has no budget sweep to plot
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for traversal, marker in (("bfs", "o"), ("predictive", "s")):
        picked = [r for r in rows if r["traversal"] == traversal]
        budgets = [r["budget"] for r in picked]
        axes[0].plot(budgets, [r["speedup_vs_serial"] for r in picked], marker=marker, label=traversal)
        axes[1].plot(budgets, [r["transitions_per_call"] for r in picked], marker=marker, label=traversal)
    axes[0].axhline(1.0, color="grey", lw=0.8, ls="--", label="serial")
    axes[0].set(xlabel="prefetch budget N_pf", ylabel="wall-time speedup vs serial", title="Speedup (same samples)")
    axes[1].set(xlabel="prefetch budget N_pf", ylabel="MH transitions per model call", title="Transitions per call")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(f"presto-ray on vLLM (CPU), {Path(report['config']['model_dir']).name}")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_report(report: dict) -> str:
    return format_table(report["rows"], COLUMNS)
