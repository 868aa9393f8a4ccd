"""Many chains on one device, in virtual time: serial, rounds and streaming chains sharing a GPU-like,
a CPU-like and a saturating device (or a measured one: `--device-curve`), each with early
rejection off and on; throughput, latency and tokens against serial chains in the same setting.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Callable

from bench.plots import save_figure
from bench.table import Columns, format_table
from bench.virtual_clock import EARLY_REJECTION, ENGINES, HORIZON, _techniques
from presto_ray.config import SamplerConfig
from presto_ray.engines.device_curve import DeviceCurve
from presto_ray.engines.virtual_clock import VirtualClockEngine
from presto_ray.output import write_json_atomic
from presto_ray.results import SampleResult

# --- load: many chains on one device -------------------------------------------------------------
# A saturating GPU-like device: a decode step costs max(1, running / SATURATION), the roofline of a
# memory-bound step that turns compute-bound (docs/benchmarks.md, "a device that saturates"). 32 =
# four chains' worth of the load budget (8): one chain speculates for free, 8 chains at full budget
# would double the step, 64 serial chains alone double it and 256 take eight times as long.
SATURATION = 32
LOAD_CHAINS = (1, 8, 64)
SATURATING_CHAINS = (1, 8, 64, 256)


def load_devices(saturation: float = SATURATION) -> dict[str, dict]:
    """The load table's devices: their VirtualClockEngine settings."""
    return {
        "gpu": {"step_cost": 1.0, "step_cost_per_sequence": 0.0, "max_running": 64},  # batch free up to 64
        "cpu": {"step_cost": 1.0, "step_cost_per_sequence": 1 / 16, "max_running": None},  # cost doubles at 16
        "gpu-saturating": {"step_cost": 1.0, "step_cost_per_sequence": 0.0, "max_running": None, "saturation": saturation},
    }  # fmt: skip


DEVICES = load_devices()
LOAD_COLUMNS: Columns = [
    ("device", "device", "{}"),
    ("saturation", "n_sat", "{}"),
    ("fixed_length", "fixed", "{}"),
    ("chains", "chains", "{}"),
    ("schedule", "schedule", "{}"),
    ("early_rejection", "early rej.", "{}"),
    ("samples_per_kilostep", "samples / 1000 time", "{:.2f}"),
    ("transitions_per_kilostep", "trans / 1000 time", "{:.1f}"),
    ("throughput_vs_serial", "vs serial", "{:.2f}x"),
    ("mean_latency", "mean latency", "{:.0f}"),
    ("tokens_per_sample", "tokens/sample", "{:.0f}"),
    ("tokens_vs_serial", "tokens vs serial", "{:.2f}"),
    ("same_as_serial", "same as serial", "{}"),
]


def measured_device(curve: DeviceCurve) -> dict[str, dict]:
    """The load table's device for a measured curve (`--device-curve`): time in seconds."""
    return {"measured": {"device": curve, "max_running": None}}


def _device_costs(device: dict) -> dict:
    """A device's settings as JSON (a measured curve as its fields)."""
    return {k: v.model_dump(mode="json") if isinstance(v, DeviceCurve) else v for k, v in device.items()}


def _saturation(device: dict) -> float | int | str:
    """The device's saturation point for a row: its n_sat, "none" (a batch free at any size), or
    "measured" (a measured curve's device: see its free batch in the row's device_costs)."""
    if device.get("device") is not None:
        return "measured"
    n_sat = device.get("saturation", float("inf"))
    if n_sat == float("inf"):
        return "none"
    return int(n_sat) if float(n_sat).is_integer() else n_sat


def _load_run(device: dict, config: SamplerConfig, chains: int) -> dict:
    from presto_ray.driver import sample_many

    engine = VirtualClockEngine(ENGINES[config.fixed_length].build(), **device)
    finished_at: dict[int, float] = {}

    def finished(i: int, _: SampleResult) -> None:
        finished_at.setdefault(i, engine.clock.time)

    results, _ = sample_many(
        engine,
        [[5, 6, 1 + c % 60, 1 + c // 60] for c in range(chains)],
        [config.model_copy(update={"seed": c}) for c in range(chains)],
        on_result=finished,
    )
    return {
        "time": engine.clock.time,
        "tokens": engine.clock.generated_tokens,
        "transitions": sum(r.stats.transitions for r in results),
        "latency": sum(finished_at.values()) / chains,
        "max_running": engine.clock.max_running,
        "samples": [r.token_ids for r in results],
    }


def run_load_bench(
    *, devices: dict[str, dict] | None = None, chain_counts: dict[str, tuple[int, ...]] | None = None,
    budget: int = 8, mh_steps: int = 16, horizon: int = HORIZON, lengths: tuple[bool, ...] = (True, False),
    out_json: str | Path | None = None, progress: Callable[[str], None] = print,
) -> list[dict]:
    """Throughput of serial, rounds and streaming chains sharing one device, in virtual time, each
    with early rejection off and on; `throughput_vs_serial` and `tokens_vs_serial` compare with
    serial chains without it, in the same setting.

    `devices`: name -> VirtualClockEngine settings (default `DEVICES`); `chain_counts`: name ->
    chain counts (a device not named: 1, 8, 64, or 1, 8, 64, 256 on a saturating device);
    `lengths`: fixed length (True) and with EOS (False), each on its ENGINES toy.
    """
    devices = DEVICES if devices is None else devices
    schedules = {
        # serial chains streamed: each waits for its own request only, not for the others'
        "serial": {"traversal": "serial", "schedule": "streaming"},
        "rounds": {"schedule": "rounds"},  # explicit: streaming is the default schedule
        "streaming": {"schedule": "streaming"},
    }
    rows = []
    for (device_name, device), fixed_length in itertools.product(devices.items(), lengths):
        base = SamplerConfig(block_size=horizon, mh_steps=mh_steps, prefetch_budget=budget, fixed_length=fixed_length)
        default = LOAD_CHAINS if _saturation(device) == "none" else SATURATING_CHAINS
        counts = (chain_counts or {}).get(device_name, default)
        for chains in counts:
            configs = {
                (name, early_rejection): base.model_copy(update=update | {"early_rejection": early_rejection})
                for name, update in schedules.items() for early_rejection in EARLY_REJECTION
            }
            runs = {key: _load_run(device, config, chains) for key, config in configs.items()}
            serial = runs["serial", False]
            for (name, early_rejection), run in runs.items():
                rows.append({
                    "device": device_name, "device_costs": _device_costs(device), "saturation": _saturation(device),
                    "chains": chains, "schedule": name, "fixed_length": fixed_length,
                    "prefetch_budget": 1 if name == "serial" else budget, "mh_steps": mh_steps, "horizon": horizon,
                    "time": run["time"], "samples_per_kilostep": 1000 * chains / run["time"],
                    "transitions_per_kilostep": 1000 * run["transitions"] / run["time"],
                    "throughput_vs_serial": serial["time"] / run["time"], "mean_latency": run["latency"],
                    "generated_tokens": run["tokens"], "tokens_per_sample": run["tokens"] / chains,
                    "tokens_vs_serial": run["tokens"] / serial["tokens"], "max_running": run["max_running"],
                    "same_as_serial": run["samples"] == serial["samples"],
                    "clock": "virtual seconds on a measured device" if device.get("device") else "virtual time",
                } | _techniques(configs[name, early_rejection]))  # fmt: skip
                r = rows[-1]
                progress(
                    f"{device_name} fixed={fixed_length} chains={chains} {name} early_rejection={early_rejection}: "
                    f"{r['throughput_vs_serial']:.2f}x, tokens {r['tokens_vs_serial']:.2f}"
                )
    if out_json:
        write_json_atomic(rows, out_json)
    return rows


def format_load_report(rows: list[dict]) -> str:
    return format_table(rows, LOAD_COLUMNS)


def plot_load(rows: list[dict], path: str | Path) -> None:
    """Per device against the chain count: samples per 1000 time units, and throughput and tokens
    per sample relative to serial."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((r["device"], r["fixed_length"]) for r in rows))
    fig, axes = plt.subplots(3, len(panels), figsize=(4.5 * len(panels), 10), sharex=True, squeeze=False)
    for col, (device, fixed_length) in enumerate(panels):
        picked = [r for r in rows if (r["device"], r["fixed_length"]) == (device, fixed_length)]
        for (schedule, color), early_rejection in itertools.product(
            (("serial", "tab:gray"), ("rounds", "tab:orange"), ("streaming", "tab:blue")), EARLY_REJECTION
        ):
            line = sorted((r for r in picked if (r["schedule"], r["early_rejection"]) == (schedule, early_rejection)), key=lambda r: r["chains"])
            chains = [r["chains"] for r in line]
            style = {"color": color, "linestyle": "-" if early_rejection else ":", "marker": "o"}
            label = f"{schedule}{', early rejection' if early_rejection else ''}"
            axes[0][col].plot(chains, [r["samples_per_kilostep"] for r in line], label=label, **style)
            axes[1][col].plot(chains, [r["throughput_vs_serial"] for r in line], label=label, **style)
            axes[2][col].plot(chains, [r["tokens_vs_serial"] for r in line], label=label, **style)
        n_sat = picked[0]["saturation"]
        length = "fixed length" if fixed_length else "EOS"
        axes[0][col].set(title=f"{device} (n_sat {n_sat}), {length}: samples / 1000 time", xscale="log", yscale="log")
        axes[1][col].set(title="throughput vs serial without early rejection", xscale="log")
        axes[2][col].set(title="tokens per sample vs serial", xlabel="chains on one device", xscale="log")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    axes[1][0].legend(fontsize=8)
    first = rows[0] if rows else {"horizon": HORIZON, "mh_steps": 16, "prefetch_budget": 8}
    budget = max((r["prefetch_budget"] for r in rows), default=8)
    fig.suptitle(f"Many chains on one device (T = {first['horizon']}, K = {first['mh_steps']}, budget {budget}; "
                 "virtual time, not wall clock)")  # fmt: skip
    save_figure(fig, path)
