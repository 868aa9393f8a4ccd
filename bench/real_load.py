"""Real-engine load benchmark: serial vs rounds vs streaming, early rejection off and on, with 1, 4,
16, 64 chains in flight at once on one engine (vLLM on the CPU, or any engine a job config builds).

bench/real.py runs one chain at a time; a deployment runs many, and what prefetching buys then
depends on how the engine batches the chains' requests. Here, at each chain count C, chain i
samples prompt i % P (P prompts) as chain i // P, seeded as a job seeds it (`prompt_seed`), and all
C chains go in one `sample_many` call. Wall clock is measured around that call; the engine's steps
are counted from vLLM's KV-cache gauge (`KVCachePeak.steps`: one `set` per engine step).

Repeats alternate the settings' order (A B ... B A) so that drift in the machine's load hits every
setting alike; speedups are taken per repeat against serial in the same repeat, then their median.
Every setting must give serial's samples, chain for chain, in every repeat (`samples_check`).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.levers import SETTINGS, Setting
from bench.plots import save_figure
from bench.real import KVCachePeak, _Missing, engine_facts
from bench.table import Columns, format_table
from presto_ray import __version__
from presto_ray.config import SamplerConfig
from presto_ray.driver import sample_many
from presto_ray.engines.base import CallAccounting, Engine
from presto_ray.engines.virtual_clock import VirtualClockEngine
from presto_ray.engines.specs import AnyEngineConfig
from presto_ray.job import encode_prompt, prompt_seed
from presto_ray.output import write_json_atomic
from presto_ray.prompts import read_prompts

# Serial chains streamed: still one request a step, but each chain sends its next request as soon
# as its last one ends instead of waiting for the round's slowest (`--settings all`)
STREAMED_SERIAL: tuple[Setting, ...] = (
    ("serial streamed", "streaming", "serial", False),
    ("serial streamed + early rejection", "streaming", "serial", True),
)
ALL_SETTINGS: tuple[Setting, ...] = SETTINGS[:2] + STREAMED_SERIAL + SETTINGS[2:]
SERIAL = SETTINGS[0][0]

COLUMNS: Columns = [
    ("chains", "chains", "{}"),
    ("setting", "setting", "{}"),
    ("is_default", "defaults", "{}"),
    ("wall_time_s", "wall s", "{:.2f}"),
    ("samples_per_second", "samples/s", "{:.3f}"),
    ("speedup_vs_serial", "vs serial", "{:.2f}x"),
    ("transitions_per_second", "trans/s", "{:.1f}"),
    ("tokens", "gen tokens", "{:.0f}"),
    ("tokens_vs_serial", "tok vs serial", "{:.2f}"),
    ("steps", "engine steps", "{:.0f}"),
    ("tokens_per_step", "tok/step", "{:.1f}"),
    ("same_as_serial", "same as serial", "{}"),
]


def run_real_load_bench(
    prompts_path: str | Path,
    chain_counts: Sequence[int],
    engine: Engine,
    *,
    engine_spec: AnyEngineConfig | None = None,
    sampler_config: SamplerConfig | None = None,
    mh_steps: int = 20,
    block_size: int = 48,
    repeats: int = 2,
    seed: int = 0,
    num_prompts: int | None = None,
    out_json: str | Path | None = None,
    out_png: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
    settings: Sequence[Setting] = SETTINGS,
) -> dict:
    """Every setting of `settings` (default SETTINGS; serial, the baseline, must be one) at every chain count, `repeats` times, on `engine` (left running:
    the caller built it; `engine_spec` the job config section that did, recorded). `sampler_config`
    (default SamplerConfig()) gives every other setting (alpha, the predictive settings' prefetch
    budget), with `block_size`, `mh_steps` and one block; `num_prompts`: only the first N prompts."""
    if not chain_counts or min(chain_counts) < 1 or repeats < 1:
        raise ValueError("chain counts and repeats must be at least 1")
    if SERIAL not in (name for name, *_ in settings):
        raise ValueError(f"the settings must include {SERIAL!r}, the baseline")
    load_at_start = os.getloadavg()
    bench_started = time.perf_counter()
    items = read_prompts(prompts_path)[:num_prompts]
    if not items:
        raise ValueError(f"{prompts_path}: no prompts")
    shared = {"block_size": block_size, "mh_steps": mh_steps, "num_blocks": 1}
    base = (sampler_config or SamplerConfig()).model_copy(update=shared)
    base = SamplerConfig.model_validate(base.model_dump())  # model_copy does not validate
    templates = {
        name: SamplerConfig.model_validate(base.model_dump() | {
            "schedule": schedule, "traversal": traversal, "early_rejection": on,
            "prefetch_budget": 1 if traversal == "serial" else base.prefetch_budget,
        })
        for name, schedule, traversal, on in settings
    }  # fmt: skip
    mine = (base.schedule, base.traversal, base.early_rejection)
    default = next((name for name, *setting in settings if tuple(setting) == mine), None)
    # a real engine replayed on a measured device (bench/replay.py): its virtual seconds, decode
    # steps and tokens (its clock and accounting run on across calls: each run takes their change)
    replay = engine if isinstance(engine, VirtualClockEngine) else None
    kv = KVCachePeak()
    clear_prefix_cache = getattr(getattr(engine, "prefix_cache", None), "clear", None)  # the transformers engine's
    measured: dict[tuple[int, str], list[dict]] = {}
    tokens: dict[tuple[int, str], list[list[list[int]]]] = {}  # per repeat, every chain's sample
    timeline: list[dict] = []
    try:
        encoded = {item.id: encode_prompt(engine.tokenizer, item) for item in items}
        # untimed: the engine's first steps are slow, and the first timed run is the baseline
        sample_many(engine, [encoded[items[0].id]], [base.model_copy(update={"block_size": 8, "mh_steps": 1, "seed": seed + 10_000})])
        for chains in chain_counts:
            work = [(items[i % len(items)], i // len(items)) for i in range(chains)]
            prompts = [encoded[item.id] for item, _ in work]
            seeds = [prompt_seed(seed, item.id, chain) for item, chain in work]
            for repeat in range(repeats):
                order = settings if repeat % 2 == 0 else settings[::-1]
                for name, *_ in order:
                    configs = [templates[name].model_copy(update={"seed": s}) for s in seeds]
                    if clear_prefix_cache is not None:
                        clear_prefix_cache()
                    kv.reset()
                    load_before = os.getloadavg()[0]
                    started, cpu_started = time.perf_counter(), time.process_time()
                    before = (replay.clock.time, replay.clock.decode_steps, replay.accounting()) if replay else None
                    results, accounting = sample_many(engine, prompts, configs)
                    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
                    steps = kv.steps
                    if replay and before:
                        wall, steps = replay.clock.time - before[0], replay.clock.decode_steps - before[1]
                        accounting = _since(replay.accounting(), before[2])
                    samples = [list(r.token_ids) for r in results]
                    run = {
                        "chains": chains, "setting": name, "repeat": repeat, "wall_time_s": wall, "cpu_time_s": cpu,
                        "load_1min_before": round(load_before, 2), "engine_steps": steps or None,  # 0: another engine's gauge
                        "transitions": sum(r.stats.transitions for r in results),
                        "generated_tokens": accounting.generated_tokens, "prompt_tokens": accounting.prompt_tokens,
                        "cached_prompt_tokens": accounting.cached_prompt_tokens, "calls": accounting.calls,
                        "num_requests": accounting.num_requests,
                        "samples_sha256": hashlib.sha256(json.dumps(samples).encode()).hexdigest(),
                    }  # fmt: skip
                    timeline.append(run)
                    measured.setdefault((chains, name), []).append(run)
                    tokens.setdefault((chains, name), []).append(samples)
                    if progress:
                        progress(
                            f"{chains} chains, repeat {repeat}, {name}: {wall:.2f} s (CPU {cpu:.2f} s, load "
                            f"{load_before:.1f}), {accounting.generated_tokens} tokens, {steps} engine steps"
                        )
    finally:
        kv.close()
    rows = [_row(chains, setting, templates[setting[0]], default, measured, tokens) for chains in chain_counts for setting in settings]
    report = {
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": {
            "presto_ray_version": __version__,
            **engine_facts(engine, engine_spec),
            "sampler": base.model_dump(exclude={"traversal", "seed", "schedule", "early_rejection"}),
            "defaults": default,  # the setting that is the sampler config as shipped (None: none of them)
            "chain_counts": list(chain_counts),
            "settings": [dict(zip(("name", "schedule", "traversal", "early_rejection"), s)) for s in settings],
            "repeats": repeats,
            "repeat_order": "settings forward in even repeats, backward in odd ones (A B ... B A), per chain count",
            "prompts": [item.id for item in items],
            "chains": "chain i samples prompt i % P as chain i // P (P prompts); all chains in one sample_many call",
            "seeds": "prompt_seed(seed, prompt id, chain), as a job seeds its chains",
            "seed": seed,
            "clock": (
                "virtual seconds of the measured device (bench/replay.py), around each sample_many call"
                if replay else "wall clock, around each sample_many call"
            ) + "; one untimed warm-up sample first",
            "device_curve": replay.device.model_dump(mode="json") if replay and replay.device else None,
            "engine_steps": (
                "engine steps that ran during the call: sets of vLLM's KV-cache gauge (one per step)"
                if any(run["engine_steps"] is not None for run in timeline) else None
            ),  # fmt: skip
            "prefix_cache": "emptied before every timed run" if clear_prefix_cache is not None else None,
        },
        "machine": {
            "cpu_count": os.cpu_count(),
            "load_average_start": [round(x, 2) for x in load_at_start],  # 1, 5, 15 minutes (os.getloadavg)
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
            "bench_wall_time_s": round(time.perf_counter() - bench_started, 1),  # engine start not included
        },
        "samples_check": samples_check(rows),
        "rows": rows,
        "runs": timeline,
    }
    if out_json:
        write_json_atomic(report, out_json)
    if out_png:
        plot(report, out_png)
    return report


def _row(
    chains: int,
    setting: Setting,
    config: SamplerConfig,
    default: str | None,
    measured: dict[tuple[int, str], list[dict]],
    tokens: dict[tuple[int, str], list[list[list[int]]]],
) -> dict:
    """One (chain count, setting): figures per repeat, their medians, ratios against serial."""
    name, schedule, traversal, on = setting
    runs, serial = measured[(chains, name)], measured[(chains, SERIAL)]
    walls = [run["wall_time_s"] for run in runs]
    wall = statistics.median(walls)
    generated = [run["generated_tokens"] for run in runs]
    steps = [run["engine_steps"] for run in runs]
    ratios = [s["wall_time_s"] / run["wall_time_s"] for s, run in zip(serial, runs)]  # repeat by repeat
    median_tokens = statistics.median(generated)
    median_steps = statistics.median(steps) if None not in steps else None
    reference = tokens[(chains, SERIAL)][0]  # serial's samples in the first repeat
    return {
        "chains": chains,
        "setting": name,
        "schedule": schedule,
        "traversal": traversal,
        "budget": config.prefetch_budget,
        "early_rejection": on,
        "is_default": name == default,
        "wall_time_s": wall,  # the median over repeats
        "wall_time_s_per_repeat": walls,
        "cpu_time_s_per_repeat": [run["cpu_time_s"] for run in runs],  # this process's (vLLM's engine core not included)
        "samples_per_second": chains / wall,
        "transitions_per_second": statistics.median(run["transitions"] for run in runs) / wall,
        "generated_tokens": generated,  # per repeat: stopped and aborted requests' tokens included
        "tokens": median_tokens,
        "tokens_same_across_repeats": len(set(generated)) == 1,  # streaming's aborts may land at other tokens
        "tokens_vs_serial": median_tokens / max(statistics.median(s["generated_tokens"] for s in serial), 1),
        "engine_steps": steps if median_steps is not None else None,
        "steps": median_steps,
        "tokens_per_step": median_tokens / median_steps if median_steps else None,
        "cached_token_share": sum(r["cached_prompt_tokens"] for r in runs) / max(sum(r["prompt_tokens"] for r in runs), 1),
        "speedup_vs_serial_per_repeat": ratios,
        "speedup_vs_serial": statistics.median(ratios),
        "same_as_serial": all(samples == reference for samples in tokens[(chains, name)]),
    }


def _since(now: CallAccounting, before: CallAccounting) -> CallAccounting:
    """What an engine's running accounting counted between two readings."""
    return CallAccounting(
        calls=now.calls - before.calls,
        num_requests=now.num_requests - before.num_requests,
        prompt_tokens=now.prompt_tokens - before.prompt_tokens,
        cached_prompt_tokens=now.cached_prompt_tokens - before.cached_prompt_tokens,
        generated_tokens=now.generated_tokens - before.generated_tokens,
    )


def samples_check(rows: Sequence[dict]) -> dict:
    """Whether every row gave serial's samples at its chain count, chain for chain, in every repeat."""
    differ = [f"{r['setting']} at {r['chains']} chains" for r in rows if r["same_as_serial"] is not True]
    return {
        "all_same": not differ,
        "rows_compared": len(rows),
        "rows_differing": differ,
        "compared_with": "serial's samples at the same chain count in the first repeat, token for token",
    }


def format_samples_check(report: dict) -> str:
    """One line: did every setting, at every chain count, in every repeat, give serial's samples?"""
    check = report.get("samples_check") or samples_check(report["rows"])
    if check["all_same"]:
        config = report["config"]
        return (
            f"samples: every setting gave serial's samples token for token ({check['rows_compared']} rows x "
            f"{config['repeats']} repeat(s), {config['engine_kind']} engine)"
        )
    return f"samples: DIFFER from serial's in {', '.join(check['rows_differing'])}"


def format_report(report: dict) -> str:
    rows = [{key: _Missing() if value is None else value for key, value in row.items()} for row in report["rows"]]
    for row in rows:
        row["is_default"] = "*" if row["is_default"] is True else ""
    return format_table(rows, COLUMNS)


def plot(report: dict, path: str | Path) -> None:
    """Against the chain count (log x), one line per setting: the wall-clock speedup over serial,
    and the tokens generated against serial's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    colors = {"serial": "tab:gray", "serial streamed": "tab:green", "rounds": "tab:orange", "streaming": "tab:blue"}
    for name in dict.fromkeys(r["setting"] for r in report["rows"]):
        line = [r for r in report["rows"] if r["setting"] == name]
        style: dict[str, Any] = {
            "color": colors[name.split(" + ")[0]], "linestyle": "-" if line[0]["early_rejection"] else ":", "marker": "o",
        }  # fmt: skip
        label = name + (" (defaults)" if line[0]["is_default"] else "")
        chains = [r["chains"] for r in line]
        axes[0].plot(chains, [r["speedup_vs_serial"] for r in line], label=label, **style)
        axes[1].plot(chains, [r["tokens_vs_serial"] for r in line], label=label, **style)
    axes[0].set(xlabel="chains in flight", ylabel="wall-time speedup vs serial", title="Speedup (same samples)")
    axes[1].set(xlabel="chains in flight", ylabel="tokens generated / serial's", title="Tokens (stopped, aborted included)")
    for ax in axes:
        ax.set_xscale("log")
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    config = report["config"]
    sampler = config["sampler"]
    fig.suptitle(
        f"Chains in flight on the {config['engine_kind']} engine ({Path(config['model_dir']).name}, wall clock), "
        f"T = {sampler['block_size']}, K = {sampler['mh_steps']}, N_pf = {sampler['prefetch_budget']}"
    )
    save_figure(fig, path)
