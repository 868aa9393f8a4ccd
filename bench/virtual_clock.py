"""Serial vs rounds vs streaming in virtual time: decode steps on the toy's continuous-batching clock.

Each chain runs alone on a GPU-like device (every decode step costs 1 whatever the batch, b = 0;
no limit on running sequences), so the figures are latencies in decode steps: exact and free of
machine noise. A request costs its generated tokens in steps once its prefix exists; rounds wait
for their slowest request; streaming walks each completion as it lands, forks from partial
proposals and aborts dead branches (docs/streaming.md). Plain decoding of the horizon costs
T steps, so `latency_vs_plain` = decode steps / T.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.plots import save_figure
from bench.table import Columns, format_table
from presto_ray.chain import Chain
from presto_ray.config import SamplerConfig
from presto_ray.driver import run_chain
from presto_ray.engines import ToyEngineConfig
from presto_ray.engines.virtual_clock import ClockStats, VirtualClockEngine
from presto_ray.output import write_json_atomic

HORIZON = 96
# Peaked like an LLM (most MH edges certain). Fixed length: EOS is an ordinary token. With EOS,
# eos_bias -2 ends about a third of the serial samples before the horizon (measured: 2 of 6).
ENGINES = {
    True: ToyEngineConfig(vocab_size=64, logit_scale=4.0, eos_bias=-3.0),
    False: ToyEngineConfig(vocab_size=64, logit_scale=4.0, eos_bias=-2.0),
}

CLOCK = "virtual decode steps: step cost 1, batch free (b = 0), unlimited running sequences"


def _techniques(config: SamplerConfig) -> dict:
    """Row keys naming the exact techniques beyond prefetching that a row ran with: every row of
    every table here (one chain per device, latency, load) passes through this one place.
    `early_rejection`: proposals were stopped once their rejection was certain."""
    return {"early_rejection": config.early_rejection}


EARLY_REJECTION = (False, True)  # every setting runs both, side by side on the same samples

COLUMNS: Columns = [
    ("schedule", "schedule", "{}"),
    ("early_rejection", "early rej.", "{}"),
    ("fixed_length", "fixed", "{}"),
    ("mh_steps", "K", "{}"),
    ("prefetch_budget", "budget", "{}"),
    ("decode_steps", "steps/sample", "{:.0f}"),
    ("speedup_vs_serial", "speedup", "{:.2f}x"),
    ("latency_vs_plain", "x plain", "{:.2f}"),
    ("tokens_vs_serial", "tokens vs serial", "{:.2f}"),
    ("early_stopped_requests", "stopped/sample", "{:.1f}"),
    ("forked_requests", "forks/sample", "{:.1f}"),
    ("aborted_requests", "aborts/sample", "{:.1f}"),
    ("mean_length", "length", "{:.1f}"),
    ("same_as_serial", "same as serial", "{}"),
]


# One chain's run: the chain after its last step, and its device's clock.
ChainRun = tuple[Chain, ClockStats]


def _run(spec: ToyEngineConfig, config: SamplerConfig, prompt: list[int]) -> ChainRun:
    engine = VirtualClockEngine(spec.build())  # step_cost 1, b = 0, unlimited: a GPU whose batch is free
    chain = Chain(prompt, config, engine.eos_token_id)
    run_chain(engine, chain)
    return chain, engine.clock


def _row(schedule: str, config: SamplerConfig, runs: list[ChainRun], serial: list[ChainRun]) -> dict:
    n = len(runs)
    steps = sum(clock.decode_steps for _, clock in runs) / n
    tokens = sum(clock.generated_tokens for _, clock in runs) / n
    serial_steps = sum(clock.decode_steps for _, clock in serial) / n
    serial_tokens = sum(clock.generated_tokens for _, clock in serial) / n
    return {
        "schedule": schedule,
        "prefetch_budget": 1 if schedule == "serial" else config.prefetch_budget,
        "mh_steps": config.mh_steps,
        "horizon": config.horizon,
        "fixed_length": config.fixed_length,
        "chains": n,
        "decode_steps": steps,
        "serial_decode_steps": serial_steps,
        "generated_tokens": tokens,
        "serial_generated_tokens": serial_tokens,
        "wasted_tokens": sum(clock.wasted_tokens for _, clock in runs) / n,
        "speedup_vs_serial": serial_steps / steps,
        "latency_vs_plain": steps / config.horizon,
        "tokens_vs_serial": tokens / serial_tokens,
        "forked_requests": sum(c.stats.forked_requests for c, _ in runs) / n,
        "early_stopped_requests": sum(c.stats.early_stopped_requests for c, _ in runs) / n,
        "aborted_requests": sum(c.stats.aborted_requests for c, _ in runs) / n,
        "mean_length": sum(len(c.output_token_ids) for c, _ in runs) / n,
        "acceptance_rate": sum(c.stats.accepted for c, _ in runs) / max(1, sum(c.stats.transitions for c, _ in runs)),
        "clock": CLOCK,
        "saturation": "none",  # the device's batch is free at any size
        "same_as_serial": all(c.output_token_ids == s.output_token_ids for (c, _), (s, _) in zip(runs, serial)),
    } | _techniques(config)


def _chains_and_serial(
    spec: ToyEngineConfig, mh_steps: int, fixed_length: bool, chains: int
) -> tuple[SamplerConfig, list[list[int]], list[SamplerConfig], list[ChainRun]]:
    """The base config, each chain's prompt and seeded config, and the serial runs they compare
    with: the serial chain with no exact technique beyond it (early rejection off)."""
    base = SamplerConfig(block_size=HORIZON, mh_steps=mh_steps, fixed_length=fixed_length, traversal="predictive")
    prompts = [[5, 6, 7 + c] for c in range(chains)]
    configs = [base.model_copy(update={"seed": c}) for c in range(chains)]
    serial = [_run(spec, c.model_copy(update={"traversal": "serial", "early_rejection": False}), p) for c, p in zip(configs, prompts)]
    return base, prompts, configs, serial


def run_virtual_clock_bench(
    *,
    budgets: Sequence[int] = (8, 20),
    mh_steps: Sequence[int] = (10, 24, 100),
    chains: int = 6,
    out_json: str | Path | None = None,
    progress: Callable[[str], None] = print,
) -> list[dict]:
    rows = []
    for fixed_length in (True, False):
        spec = ENGINES[fixed_length]
        for k in mh_steps:
            base, prompts, configs, serial = _chains_and_serial(spec, k, fixed_length, chains)
            off = {"early_rejection": False, "traversal": "serial"}
            rows.append(_row("serial", base.model_copy(update=off), serial, serial) | {"engine": spec.model_dump()})
            on = {"traversal": "serial"}
            runs = [_run(spec, c.model_copy(update=on), p) for c, p in zip(configs, prompts)]
            rows.append(_row("serial", base.model_copy(update=on), runs, serial) | {"engine": spec.model_dump()})
            for budget in budgets:
                for schedule in ("rounds", "streaming"):
                    for early_rejection in EARLY_REJECTION:
                        update = {"prefetch_budget": budget, "schedule": schedule, "early_rejection": early_rejection}
                        runs = [_run(spec, c.model_copy(update=update), p) for c, p in zip(configs, prompts)]
                        rows.append(_row(schedule, base.model_copy(update=update), runs, serial) | {"engine": spec.model_dump()})
                        r = rows[-1]
                        progress(
                            f"fixed={fixed_length} K={k} N={budget} {schedule} early_rejection={early_rejection}: "
                            f"{r['speedup_vs_serial']:.2f}x, tokens {r['tokens_vs_serial']:.2f}"
                        )
    if out_json:
        write_json_atomic(rows, out_json)
    return rows


def format_report(rows: list[dict]) -> str:
    return format_table(rows, COLUMNS)


# Latency at K = 10: what a power sample costs against plain decoding of the horizon, for the
# default token rule at budgets 20 and 48, and for the rule off (`speculation_gain` 0) at 20.
LATENCY_SETTINGS = ((20, None), (48, None), (20, 0.0))

LATENCY_COLUMNS: Columns = [
    ("early_rejection", "early rej.", "{}"),
    ("fixed_length", "fixed", "{}"),
    ("prefetch_budget", "budget", "{}"),
    ("speculation_gain", "speculation_gain", "{}"),
    ("latency_vs_plain", "x plain", "{:.2f}"),
    ("rounds_latency_vs_plain", "rounds x plain", "{:.2f}"),
    ("tokens_vs_serial", "tokens vs serial", "{:.2f}"),
    ("rounds_tokens_vs_serial", "rounds tokens vs serial", "{:.2f}"),
    ("serial_latency_vs_plain", "serial x plain", "{:.2f}"),
    ("same_as_serial", "same as serial", "{}"),
]


def run_latency_bench(
    *, mh_steps: int = 10, settings: Sequence[tuple[int, float | None]] = LATENCY_SETTINGS, chains: int = 6,
    out_json: str | Path | None = None, progress: Callable[[str], None] = print,
) -> list[dict]:
    """Streaming's latency relative to plain decoding (decode steps / T) at K = `mh_steps`, beside
    rounds at the same budget, for each (budget, speculation_gain) in `settings` (None: default),
    with early rejection off and on; `serial_latency_vs_plain` is the serial chain's with the same."""
    rows = []
    for fixed_length in (True, False):
        spec = ENGINES[fixed_length]
        base, prompts, configs, serial_off = _chains_and_serial(spec, mh_steps, fixed_length, chains)
        serial_on = [_run(spec, c.model_copy(update={"traversal": "serial"}), p) for c, p in zip(configs, prompts)]
        for (budget, gain), early_rejection in itertools.product(settings, EARLY_REJECTION):
            serial = serial_on if early_rejection else serial_off
            update = {"prefetch_budget": budget, "early_rejection": early_rejection} | ({} if gain is None else {"speculation_gain": gain})
            config = base.model_copy(update=update)
            streaming = [_run(spec, c.model_copy(update=update | {"schedule": "streaming"}), p) for c, p in zip(configs, prompts)]
            rounds = [_run(spec, c.model_copy(update=update | {"schedule": "rounds"}), p) for c, p in zip(configs, prompts)]
            row = _row("streaming", config, streaming, serial)
            rounds_row = _row("rounds", config, rounds, serial)
            rows.append(row | {
                "speculation_gain": config.speculation_gain,
                "rounds_latency_vs_plain": rounds_row["latency_vs_plain"],
                "rounds_tokens_vs_serial": rounds_row["tokens_vs_serial"],
                "serial_latency_vs_plain": row["serial_decode_steps"] / config.horizon,
                "same_as_serial": row["same_as_serial"] and rounds_row["same_as_serial"],
                "engine": spec.model_dump(),
            })  # fmt: skip
            progress(
                f"latency fixed={fixed_length} N={budget} gain={config.speculation_gain} early_rejection={early_rejection}: "
                f"{row['latency_vs_plain']:.2f}x plain"
            )
    if out_json:
        write_json_atomic(rows, out_json)
    return rows


def format_latency_report(rows: list[dict]) -> str:
    return format_table(rows, LATENCY_COLUMNS)


def plot(rows: list[dict], path: str | Path) -> None:
    """Speedup over serial and tokens relative to serial against K, rounds vs streaming per budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    for col, fixed_length in enumerate((True, False)):
        picked = [r for r in rows if r["fixed_length"] == fixed_length and r["schedule"] != "serial"]
        for (schedule, style), early_rejection in itertools.product((("rounds", "--"), ("streaming", "-")), EARLY_REJECTION):
            for budget in sorted({r["prefetch_budget"] for r in picked}):
                line = sorted(
                    (r for r in picked if (r["schedule"], r["prefetch_budget"], r["early_rejection"]) == (schedule, budget, early_rejection)),
                    key=lambda r: r["mh_steps"],
                )
                ks = [r["mh_steps"] for r in line]
                label = f"{schedule}, budget {budget}{', early rej.' if early_rejection else ''}"
                axes[0][col].plot(ks, [r["speedup_vs_serial"] for r in line], style, marker="o", label=label)
                axes[1][col].plot(ks, [r["tokens_vs_serial"] for r in line], style, marker="o", label=label)
        axes[0][col].set(title=f"{'fixed length' if fixed_length else 'with EOS'}: speedup over serial (decode steps)", xscale="log")
        axes[1][col].set(title="tokens generated relative to serial", xlabel="MH steps K", xscale="log")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Serial vs rounds vs streaming on the toy's virtual clock (T = 96; virtual, not wall clock)")
    save_figure(fig, path)
