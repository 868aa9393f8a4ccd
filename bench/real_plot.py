"""The real-model benchmark's plots (bench/real.py's report): the budget sweep's speedup and tokens
against serial, or, when the report holds early rejection off and on, the two side by side per run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.plots import save_figure


def plot(report: dict, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    if len({r["early_rejection"] for r in rows}) > 1:
        _plot_on_off(report, path, plt)
        return
    rows = [r for r in rows if r["sampler"] == "power_mh" and r["traversal"] != "serial"]
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
    fig.suptitle(f"presto-ray on {_engine_label(report['config'])}, {Path(report['config']['model_dir']).name}")
    save_figure(fig, path)


def _engine_label(config: dict, note: str = "") -> str:
    """ "vLLM (CPU)" (the default engine, and reports from before engine_kind), else the engine's kind
    and device; `note` joins the parenthesis."""
    kind = config.get("engine_kind", "vllm")
    device = "CPU" if kind == "vllm" else (config.get("engine_runtime") or {}).get("device")
    inside = ", ".join(part for part in (device, note) if part)
    name = "vLLM" if kind == "vllm" else f"the {kind} engine"
    return f"{name} ({inside})" if inside else name


def _label(row: dict) -> str:
    if row["traversal"] == "serial":
        return f"{row['sampler']}\nserial"
    return f"{row['sampler']}\n{row['schedule']} {row['budget']}"


def _plot_on_off(report: dict, path: str | Path, plt: Any) -> None:
    """Early rejection off and on, bar beside bar: speedup vs serial off, tokens vs serial off and
    peak KV-cache usage for every run."""
    rows = report["rows"]
    labels = list(dict.fromkeys(_label(r) for r in rows))
    panels = [
        ("speedup_vs_serial_off", "wall-time speedup vs serial off", "Speedup (same samples)"),
        ("tokens_vs_serial_off", "tokens generated / serial off", "Tokens (stopped, aborted included)"),
        ("peak_kv_cache_usage", "peak share of the KV pool", "Peak KV-cache usage (vLLM gauge)"),
    ]
    if all(r["peak_kv_cache_usage"] is None for r in rows):  # an engine without vLLM's gauge
        panels = panels[:2]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4))
    width = 0.38
    for ax, (key, ylabel, title) in zip(axes, panels):
        for k, (on, color) in enumerate(((False, "tab:grey"), (True, "tab:blue"))):
            values = {_label(r): r[key] for r in rows if r["early_rejection"] == on}
            xs = [i + (k - 0.5) * width for i, label in enumerate(labels) if values.get(label) is not None]
            ys = [values[label] for label in labels if values.get(label) is not None]
            ax.bar(xs, ys, width, color=color, label=f"early rejection {'on' if on else 'off'}")
        if key != "peak_kv_cache_usage":
            ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        ax.set(ylabel=ylabel, title=title)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    config = report["config"]
    block = config["sampler"].get("block_size")
    steps = config["sampler"].get("mh_steps")
    fig.suptitle(f"Exact early rejection on {_engine_label(config, 'wall clock')}, {Path(str(config['model_dir'])).name}, T = {block}, K = {steps}")
    save_figure(fig, path)
