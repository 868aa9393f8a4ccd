"""Host-time benchmark: what the control plane costs per generated token, per schedule and lever.

On the toy engine a decode step is nearly free, so CPU time is host time: planning, selection,
bounds, the predictor, the walk and the driver's loop, plus the toy's own numpy model, which is
timed apart (`engine_s`: CPU time inside engine calls) so that `control_ms_per_token` is the
control plane alone. Every setting samples the same chains (configs/toy.yaml's sampler: block 48,
2 blocks, K 25, budget 16, predictive), at each chain count, all in one process on CPU time
(`time.process_time`), and must give the serial chain's samples (`same_as_serial`).

`profile=True` runs each setting once more under cProfile and splits its time by part of the
control plane (shares of the profiled run, whose overhead inflates small calls).
"""

from __future__ import annotations

import cProfile
import os
import pstats
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.levers import SETTINGS, Setting
from bench.table import Columns, format_table
from bench.toy import TOY_ENGINE
from presto_ray import __version__
from presto_ray.config import SamplerConfig
from presto_ray.driver import sample_many
from presto_ray.engines.base import EngineOutput, ProposalRequest
from presto_ray.engines.toy import ToyEngine
from presto_ray.keys import derive_seed
from presto_ray.output import write_json_atomic

BASE = SamplerConfig(alpha=4.0, block_size=48, num_blocks=2, mh_steps=25, prefetch_budget=16, traversal="predictive", seed=0)

# the parts of the control plane a profile names: (module file, function) -> part
PARTS: dict[tuple[str, str], str] = {
    ("planner.py", "tree"): "planning",
    ("planner.py", "select"): "selection",
    ("selection.py", "reach_probabilities"): "selection",
    ("selection.py", "fork_points_worth_waking"): "fork points",
    ("planner.py", "bounds"): "bounds",
    ("planner.py", "observe"): "predictor",
    ("chain.py", "walk"): "walk",
    ("host_time.py", "_timed"): "engine",
}

COLUMNS: Columns = [
    ("setting", "setting", "{}"),
    ("chains", "chains", "{}"),
    ("generated_tokens", "tokens", "{}"),
    ("events", "events", "{}"),
    ("fork_events", "fork points", "{}"),
    ("cpu_s", "CPU s", "{:.2f}"),
    ("engine_s", "engine CPU s", "{:.2f}"),
    ("host_ms_per_token", "host ms/token", "{:.4f}"),
    ("control_ms_per_token", "control ms/token", "{:.4f}"),
    ("control_us_per_event", "control us/event", "{:.0f}"),
    ("control_vs_serial", "control vs serial", "{:.1f}x"),
    ("same_as_serial", "same as serial", "{}"),
]


class _Clock:
    """CPU seconds spent inside engine calls, and the events a streaming engine delivered (of
    them, fork points: a running request reached tokens a chain waits for; the rest end requests)."""

    def __init__(self) -> None:
        self.engine_s = 0.0
        self.events = 0
        self.fork_events = 0

    def _timed(self, call: Callable[..., Any], *args: Any) -> Any:
        started = time.process_time()
        try:
            return call(*args)
        finally:
            self.engine_s += time.process_time() - started


class _TimedStream:
    """A StreamingEngine whose every call is timed (a proxy: attributes pass through)."""

    def __init__(self, stream: Any, clock: _Clock) -> None:
        self._stream, self._clock = stream, clock

    def advance(self) -> Any:
        events = self._clock._timed(self._stream.advance)
        self._clock.events += len(events)
        self._clock.fork_events += sum(event.completion is None and event.error is None for event in events)
        return events

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._stream, name)
        if not callable(value):
            return value
        return lambda *args: self._clock._timed(value, *args)


class _TimedEngine:
    def __init__(self, engine: ToyEngine, clock: _Clock) -> None:
        self._engine, self._clock = engine, clock
        self.eos_token_id = engine.eos_token_id

    def generate(self, requests: Sequence[ProposalRequest]) -> EngineOutput:
        self._clock.events += 1  # a round (or a serial step): one call, walked at once
        output: EngineOutput = self._clock._timed(self._engine.generate, requests)
        return output

    @property
    def free_batch(self) -> float:
        return self._engine.free_batch

    def streaming(self) -> _TimedStream:
        return _TimedStream(self._engine.streaming(), self._clock)


def _chains(num_chains: int, setting: tuple[str, str, str, bool], base: SamplerConfig) -> tuple[list[list[int]], list[SamplerConfig]]:
    """Prompts and configs: two chains per prompt, seeds derived per (prompt, chain)."""
    _, schedule, traversal, early = setting
    config = base.model_copy(
        update={
            "schedule": schedule,
            "traversal": traversal,
            "early_rejection": early,
            "prefetch_budget": 1 if traversal == "serial" else base.prefetch_budget,
        }
    )
    prompts = [[5 + (c // 2) % 50, 6 + c // 100, 7 + (c // 2) % 7, 9] for c in range(num_chains)]
    configs = [config.model_copy(update={"seed": derive_seed(base.seed, c // 2, c % 2)}) for c in range(num_chains)]
    return prompts, configs


def _measure(num_chains: int, setting: tuple[str, str, str, bool], base: SamplerConfig) -> tuple[dict, list[tuple[int, ...]]]:
    prompts, configs = _chains(num_chains, setting, base)
    clock = _Clock()
    engine = _TimedEngine(ToyEngine(**TOY_ENGINE), clock)
    started, wall_started = time.process_time(), time.perf_counter()
    results, _ = sample_many(engine, prompts, configs)  # type: ignore[arg-type]
    cpu_s, wall_s = time.process_time() - started, time.perf_counter() - wall_started
    tokens = sum(r.stats.generated_tokens for r in results)
    control_s = cpu_s - clock.engine_s
    row = {
        "setting": setting[0],
        "schedule": setting[1],
        "traversal": setting[2],
        "early_rejection": setting[3],
        "chains": num_chains,
        "generated_tokens": tokens,
        "transitions": sum(r.stats.transitions for r in results),
        "events": clock.events,
        "fork_events": clock.fork_events,
        "cpu_s": cpu_s,
        "wall_s": wall_s,
        "engine_s": clock.engine_s,
        "host_ms_per_token": 1000 * cpu_s / tokens,
        "control_ms_per_token": 1000 * control_s / tokens,
        "control_us_per_event": 1e6 * control_s / clock.events,
    }
    return row, [r.token_ids for r in results]


def _profile(num_chains: int, setting: tuple[str, str, str, bool], base: SamplerConfig) -> dict[str, float]:
    """Shares of a profiled run's time by part of the control plane (the rest: books and driver)."""
    profiler = cProfile.Profile()
    profiler.enable()
    _measure(num_chains, setting, base)
    profiler.disable()
    stats: Any = pstats.Stats(profiler)
    total = stats.total_tt
    shares: dict[str, float] = {}
    for (path, _, function), (_, _, _, cumulative, _) in stats.stats.items():
        part = PARTS.get((Path(path).name, function))
        if part is not None:
            shares[part] = shares.get(part, 0.0) + cumulative / total
    shares["books and driver"] = max(0.0, 1.0 - sum(shares.values()))
    return shares


def run_host_time_bench(
    chain_counts: Sequence[int] = (1, 4, 16),
    base: SamplerConfig = BASE,
    settings: Sequence[Setting] = SETTINGS,
    profile: bool = False,
    out_json: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Every setting at every chain count, serial first; `profile`: each one's parts too."""
    # untimed: the predictor's first refit imports scikit-learn (~1 s of CPU), which would land on
    # the first predictive row (rounds at the first chain count)
    from sklearn.linear_model import LogisticRegression  # noqa: F401

    rows = []
    for num_chains in chain_counts:
        serial_tokens: list[tuple[int, ...]] | None = None
        serial_control = None
        for setting in settings:
            row, tokens = _measure(num_chains, setting, base)
            if serial_tokens is None:
                serial_tokens, serial_control = tokens, row["control_ms_per_token"]
            row["same_as_serial"] = tokens == serial_tokens
            row["control_vs_serial"] = row["control_ms_per_token"] / serial_control
            if profile:
                row["profile_shares"] = _profile(num_chains, setting, base)
            rows.append(row)
            if progress is not None:
                progress(f"{setting[0]}, {num_chains} chains: {row['host_ms_per_token']:.4f} ms/token host, same={row['same_as_serial']}")
    report: dict[str, Any] = {
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "clock": "time.process_time (CPU seconds of this process)",
        "load_average": os.getloadavg(),
        "cpus": os.cpu_count(),
        "config": {
            "presto_ray_version": __version__,
            "engine": {"kind": "toy", **TOY_ENGINE},
            "sampler": base.model_dump(),
            "chain_counts": list(chain_counts),
            "chains": "chain c: prompt [5 + (c // 2) % 50, 6 + c // 100, 7 + (c // 2) % 7, 9], seed derive_seed(seed, c // 2, c % 2)",
        },
        "rows": rows,
    }
    if out_json is not None:
        write_json_atomic(report, out_json)
    return report


def format_report(report: dict) -> str:
    table = format_table(report["rows"], COLUMNS)
    lines = [table]
    for row in report["rows"]:
        shares = row.get("profile_shares")
        if shares:
            parts = ", ".join(f"{part} {share:.0%}" for part, share in sorted(shares.items(), key=lambda kv: -kv[1]))
            lines.append(f"{row['setting']}, {row['chains']} chains (profile): {parts}")
    return "\n".join(lines)
