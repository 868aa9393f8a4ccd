"""Real-model benchmark: serial PowerMH vs rounds vs streaming on vLLM, side by side, same seeds.

For each prompt the runs go back to back on one engine (interleaved, so drift in machine load
hits all of them alike); wall time is measured around each sample, and ratios are taken against
serial on the same prompts and seeds.

Exact early rejection (`SamplerConfig.early_rejection`): with `early_rejection="both"` (the
default) every run goes twice on each prompt, off then on, so each schedule's rows sit side by
side on the same samples; `speedup_vs_serial_off` compares every row with serial without early
rejection, the common baseline. Every row also reports the peak of vLLM's own KV-cache gauge
(`KVCachePeak`).

Any engine (`engine`, e.g. one a job config's `engine:` section built: `presto-ray bench-real
--config`): its prefix cache, where it has one as the transformers engine does, is emptied before
every timed run, so no run reads KV another run left. The report records the machine's load
average at the start and the end, each run's wall clock, process CPU time and the load before it
(`runs`, in the order they ran), and whether every run gave serial's samples (`samples_check`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from bench.real_plot import plot
from bench.table import Columns, format_table
from presto_ray import __version__
from presto_ray.config import SamplerConfig
from presto_ray.driver import sample_many
from presto_ray.engines.base import CallAccounting, Engine
from presto_ray.engines.specs import AnyEngineConfig
from presto_ray.engines.vllm import VLLMEngine, VLLMEngineConfig
from presto_ray.job import encode_prompt
from presto_ray.output import write_json_atomic
from presto_ray.prompts import read_prompts
from presto_ray.results import SampleResult

COLUMNS: Columns = [
    ("sampler", "sampler", "{}"),
    ("traversal", "traversal", "{}"),
    ("schedule", "schedule", "{}"),
    ("budget", "N_pf", "{}"),
    ("early_rejection", "early rej.", "{}"),
    ("wall_time_s", "wall s", "{:.1f}"),
    ("speedup_vs_serial_off", "vs serial off", "{:.2f}x"),
    ("requests_per_sample", "req/sample", "{:.1f}"),
    ("calls_per_sample", "calls/sample", "{:.1f}"),
    ("transitions_per_second", "trans/s", "{:.2f}"),
    ("generated_tokens_per_sample", "gen tok/sample", "{:.0f}"),
    ("tokens_vs_serial_off", "tok vs serial off", "{:.2f}"),
    ("early_stopped_per_sample", "stopped/sample", "{:.1f}"),
    ("early_stop_tokens_left_per_sample", "tok left/sample", "{:.0f}"),
    ("aborted_per_sample", "aborted/sample", "{:.1f}"),
    ("forked_per_sample", "forked/sample", "{:.1f}"),
    ("cached_token_share", "cached share", "{:.1%}"),
    ("peak_kv_cache_usage", "peak KV", "{:.2%}"),
    ("acceptance_rate", "accept", "{:.1%}"),
    ("same_as_serial", "same as serial", "{}"),
]

Run = tuple[str, str, int, str]  # (sampler, traversal, prefetch budget, schedule)
SERIAL: Run = ("power_mh", "serial", 1, "rounds")
# One prompt's run: its result, what the engine spent, wall-clock seconds, the peak KV-cache share
# (or None), this process's CPU seconds (all its threads; not vLLM's engine-core process)
Measured = tuple[SampleResult, CallAccounting, float, float | None, float]
EarlyRejection = Literal["both", "on", "off"]
EARLY_REJECTION: dict[str, tuple[bool, ...]] = {"both": (False, True), "on": (True,), "off": (False,)}

VARIANT_RUNS: list[Run] = [
    ("power_mh", "serial", 1, "rounds"), ("power_mh", "predictive", 8, "rounds"), ("power_mh", "predictive", 8, "streaming"),
    ("entropy_cut", "serial", 1, "rounds"), ("entropy_cut", "predictive", 8, "streaming"),
    ("multi_try", "serial", 1, "rounds"), ("multi_try", "predictive", 12, "streaming"),
]  # fmt: skip
NUM_TRIES = 3
KV_GAUGES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # vLLM v1's name, then the older one


def default_runs(budgets: Sequence[int]) -> list[Run]:
    """Serial PowerMH, then predictive rounds and streaming at each budget."""
    return [SERIAL] + [("power_mh", "predictive", b, schedule) for b in budgets for schedule in ("rounds", "streaming")]


class KVCachePeak:
    """The peak of vLLM's own KV-cache gauge (`vllm:kv_cache_usage_perc`: the share of the KV pool's
    blocks held by requests, free prefix-cached blocks not counted) between `reset` and `peak`.

    AsyncLLM runs its stat loggers in this process: after every engine step its output handler
    sets the Prometheus gauge from the step's scheduler stats. The gauge's `set` is wrapped, so
    every value it takes is seen (no polling, no step missed). `available` is False where there is
    no such gauge (the toy engine, or vLLM with log stats off); `peak` is then None.

    The same wrap counts the gauge's `set` calls (`steps`): vLLM's scheduler attaches its stats to
    every engine step's outputs, and the logger sets the gauge once per stats it receives, so the
    count between `reset` and `steps` is the number of engine steps that ran (summed over engines
    where the gauge is labelled with several); None where there is no gauge."""

    def __init__(self, registry: Any = None) -> None:
        self._lock = threading.Lock()
        self._peak: float | None = None
        self._sets = 0
        self._restore: list[tuple[Any, Any]] = []
        if registry is None:
            try:
                from prometheus_client import REGISTRY as registry  # where vLLM's PrometheusStatLogger registers
            except ImportError:
                return
        names = getattr(registry, "_names_to_collectors", {})
        collector = next((names[n] for n in KV_GAUGES if n in names), None)
        if collector is None:
            return
        children = list(getattr(collector, "_metrics", {}).values()) or [collector]  # labelled: one per engine
        for child in children:
            self._restore.append((child, child.__dict__.get("set")))
            child.set = self._wrap(child.set)

    def _wrap(self, original: Callable[[float], None]) -> Callable[[float], None]:
        def set_and_track(value: float) -> None:
            original(value)
            with self._lock:
                self._peak = float(value) if self._peak is None else max(self._peak, float(value))
                self._sets += 1

        return set_and_track

    @property
    def available(self) -> bool:
        return bool(self._restore)

    def reset(self) -> None:
        with self._lock:
            self._peak = None
            self._sets = 0

    @property
    def peak(self) -> float | None:
        with self._lock:
            return self._peak

    @property
    def steps(self) -> int | None:
        """The gauge's `set` calls since `reset` (engine steps); None where there is no gauge."""
        if not self.available:
            return None
        with self._lock:
            return self._sets

    def close(self) -> None:
        for child, own in self._restore:
            if own is None:
                del child.set
            else:
                child.set = own
        self._restore = []


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
    early_rejection: EarlyRejection = "both",
    num_prompts: int | None = None,
    engine: Engine | None = None,
    engine_spec: AnyEngineConfig | None = None,
    sampler_config: SamplerConfig | None = None,
) -> dict:
    """Each run is (sampler, traversal, budget, schedule); by default `default_runs(budgets)`. Every
    run goes with early rejection off and on (`early_rejection` "both"), or one of them. `engine`:
    an engine to use instead of starting vLLM (left running; tests pass the toy), `engine_spec` the
    job config section that built it (recorded, with its kind); `sampler_config`: the settings every run
    shares (alpha and the rest: a job config's; default SamplerConfig's), with `block_size`,
    `mh_steps` and one block; `num_prompts`: only the first N prompts."""
    if early_rejection not in EARLY_REJECTION:
        raise ValueError(f"early_rejection: expected one of {', '.join(EARLY_REJECTION)}, got {early_rejection!r}")
    load_at_start = os.getloadavg()
    bench_started = time.perf_counter()
    items = read_prompts(prompts_path)[:num_prompts]
    runs = list(runs or default_runs(budgets))
    settings = EARLY_REJECTION[early_rejection]
    owned = engine is None
    engine = engine if engine is not None else VLLMEngine(engine_config)
    kv = KVCachePeak()
    clear_prefix_cache = getattr(getattr(engine, "prefix_cache", None), "clear", None)  # the transformers engine's
    try:
        prompts = [encode_prompt(engine.tokenizer, item) for item in items]
        shared = {"block_size": block_size, "mh_steps": mh_steps, "num_blocks": 1}
        base = sampler_config.model_copy(update=shared) if sampler_config is not None else SamplerConfig(**shared)
        base = SamplerConfig.model_validate(base.model_dump())  # model_copy does not validate
        per_run: dict[tuple[Run, bool], list[Measured]] = {(run, on): [] for run in runs for on in settings}
        timeline: list[dict] = []
        if prompts:  # untimed: the engine's first steps are slow, and the first timed run is the baseline
            sample_many(engine, [prompts[0]], [base.model_copy(update={"block_size": 8, "mh_steps": 1, "seed": seed + 10_000})])
        for p, item in enumerate(items):
            for run in runs:
                for on in settings:
                    sampler, traversal, budget, schedule = run
                    update = {
                        "sampler": sampler, "traversal": traversal, "prefetch_budget": budget, "seed": seed + p,
                        "schedule": schedule, "early_rejection": on,
                    }  # fmt: skip
                    if sampler == "multi_try":
                        update["num_tries"] = NUM_TRIES
                    if clear_prefix_cache is not None:
                        clear_prefix_cache()
                    kv.reset()
                    load_before = os.getloadavg()[0]
                    started, cpu_started = time.perf_counter(), time.process_time()
                    results, accounting = sample_many(engine, [prompts[p]], [base.model_copy(update=update)])
                    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
                    per_run[(run, on)].append((results[0], accounting, wall, kv.peak, cpu))
                    timeline.append({
                        "prompt": item.id, "sampler": sampler, "traversal": traversal, "schedule": schedule,
                        "budget": budget, "early_rejection": on, "wall_time_s": round(wall, 3),
                        "cpu_time_s": round(cpu, 3), "load_1min_before": round(load_before, 2),
                    })  # fmt: skip
                    if progress:
                        stats = results[0].stats
                        progress(
                            f"{item.id} {sampler} {traversal} {schedule} N_pf={budget} early_rejection={on}: "
                            f"{stats.requests} requests, {stats.early_stopped_requests} stopped, {wall:.1f} s "
                            f"(CPU {cpu:.1f} s, load {load_before:.1f})"
                        )
        rows = []
        for run, on in per_run:
            sampler = run[0]
            serial = (sampler, "serial", 1, "rounds")
            baseline = per_run.get((serial, False)) or per_run.get((serial, on))  # serial off where it ran
            rows.append(_row(run, on, per_run[(run, on)], per_run.get((serial, on)), baseline, (serial, False) in per_run,
                             per_run.get((run, not on))))  # fmt: skip
        report = {
            "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "config": {
                "presto_ray_version": __version__,
                **engine_facts(engine, engine_spec),
                "prompts": [item.id for item in items],
                "sampler": base.model_dump(
                    exclude={"traversal", "prefetch_budget", "seed", "sampler", "num_tries", "schedule", "early_rejection"}
                ),
                "multi_try_num_tries": NUM_TRIES,
                "early_rejection": early_rejection,
                "seeds": "seed + prompt index",
                "seed": seed,
                "wall_time": "measured around each sample, engine start and one untimed warm-up sample excluded",
                "kv_cache_gauge": KV_GAUGES[0] if kv.available else None,
                "kv_cache_blocks": _kv_cache_blocks(engine),
                "prefix_cache": "emptied before every timed run" if clear_prefix_cache is not None else None,
            },
            "machine": {
                "cpu_count": os.cpu_count(),
                "load_average_start": [round(x, 2) for x in load_at_start],  # 1, 5, 15 minutes (os.getloadavg)
                "load_average_end": [round(x, 2) for x in os.getloadavg()],
                "bench_wall_time_s": round(time.perf_counter() - bench_started, 1),  # engine start (if owned) included
            },
            "samples_check": samples_check(rows),
            "rows": rows,
            "runs": timeline,
        }
    finally:
        kv.close()
        if owned:
            engine.shutdown()
    if out_json:
        write_json_atomic(report, out_json)
    if out_png:
        plot(report, out_png)
    return report


def engine_facts(engine: Any, spec: AnyEngineConfig | None) -> dict[str, Any]:
    """What a report records of the engine it ran on: its kind, its config (the job config section
    that built it, where one did), what it resolved at start-up, its model and its start time."""
    return {
        "engine_kind": _engine_kind(engine, spec),
        "engine": (
            spec.model_dump(mode="json") if spec is not None
            else engine.config.model_dump() if hasattr(engine, "config") else type(engine).__name__
        ),  # fmt: skip
        "engine_runtime": _engine_runtime(engine),
        "model_dir": str(getattr(engine, "model_dir", getattr(engine, "model_name", type(engine).__name__))),
        "engine_startup_s": round(getattr(engine, "startup_time_s", 0.0), 1),
    }


def _engine_kind(engine: Any, spec: AnyEngineConfig | None) -> str:
    """The engine's `kind` as a job config names it (toy, vllm, transformers); else its class."""
    if spec is not None:
        return spec.kind
    return str(getattr(getattr(engine, "config", None), "kind", None) or type(engine).__name__)


def _engine_runtime(engine: Any) -> dict:
    """What the engine resolved at start-up that its config may leave open: the torch device, dtype,
    batch invariance and torch's CPU threads (where torch is loaded: the transformers and vLLM
    engines; vLLM's own workers may set theirs)."""
    loaded = getattr(engine, "loaded", None)
    facts: dict[str, Any] = {
        "device": str(getattr(engine, "device", None) or "") or None,
        "dtype": str(getattr(loaded, "dtype", None) or "") or None,
        "batch_invariant": getattr(engine, "batch_invariant", None),
        "torch_threads": None,
    }
    torch = sys.modules.get("torch")  # never imported here: an engine without torch has no threads to report
    if torch is not None:
        facts["torch_threads"] = int(torch.get_num_threads())
    return facts


def samples_check(rows: Sequence[dict]) -> dict:
    """Whether every row gave its baseline's samples (serial without early rejection where it ran),
    token for token on every prompt: `all_same` True only if every row was compared and matched."""
    differ = [_run_name(r) for r in rows if r["same_as_serial"] is not True]
    return {
        "all_same": not differ,
        "rows_compared": sum(r["same_as_serial"] is not None for r in rows),
        "rows_differing": differ,
        "compared_with": "serial without early rejection (serial with it where off did not run), token for token",
    }


def format_samples_check(report: dict) -> str:
    """One line: do all runs give serial's samples?"""
    check = report.get("samples_check") or samples_check(report["rows"])
    prompts = len(report["config"]["prompts"])
    if check["all_same"]:
        return (
            f"samples: every run gave serial's samples token for token ({check['rows_compared']} runs x "
            f"{prompts} prompt(s), {report['config']['engine_kind']} engine)"
        )
    return f"samples: DIFFER from serial's in {', '.join(check['rows_differing'])}"


def _run_name(row: dict) -> str:
    name = "serial" if row["traversal"] == "serial" else f"{row['schedule']} {row['budget']}"
    return f"{row['sampler']} {name} early rejection {'on' if row['early_rejection'] else 'off'}"


def _kv_cache_blocks(engine: Any) -> int | None:
    """The KV pool's size in blocks (of the engine's kv_block_size tokens) as vLLM profiled it; None
    for an engine without one."""
    try:
        return int(engine.runtime.llm.vllm_config.cache_config.num_gpu_blocks)
    except (AttributeError, TypeError):
        return None


def _row(
    run: Run,
    on: bool,
    runs: list[Measured],
    serial: list[Measured] | None,
    baseline: list[Measured] | None,
    baseline_is_off: bool,
    other: list[Measured] | None,
) -> dict:
    """One row: `serial` is serial with the same early-rejection setting, `baseline` serial without
    it (the common baseline; serial on where off did not run), `other` this run with the other
    setting (None where only one ran)."""
    sampler, traversal, budget, schedule = run
    n = len(runs)

    def stat(of: list[Measured], field: str) -> float:
        return sum(getattr(result.stats, field) for result, *_ in of)

    def engine(of: list[Measured], field: str) -> float:
        return sum(getattr(accounting, field) for _, accounting, *_ in of)

    def wall_of(of: list[Measured]) -> float:
        return sum(entry[2] for entry in of)

    def same(a: list[Measured], b: list[Measured]) -> bool:
        return all(x[0].token_ids == y[0].token_ids for x, y in zip(a, b))

    wall = wall_of(runs)
    cpu = sum(entry[4] for entry in runs)
    transitions = stat(runs, "transitions")
    peaks = [entry[3] for entry in runs if entry[3] is not None]
    return {
        "sampler": sampler,
        "traversal": traversal,
        "schedule": schedule,
        "budget": budget,
        "early_rejection": on,
        "wall_time_s": wall,
        "wall_time_s_per_sample": [entry[2] for entry in runs],  # in prompt order
        "cpu_time_s": cpu,  # this process's CPU seconds, all its threads (vLLM: its engine core's not included)
        "cpu_time_s_per_sample": [entry[4] for entry in runs],
        "speedup_vs_serial": wall_of(serial) / wall if serial else None,  # serial with the same setting
        "speedup_vs_serial_off": wall_of(baseline) / wall if baseline and baseline_is_off else None,
        "requests_per_sample": stat(runs, "requests") / n,
        "calls_per_sample": engine(runs, "calls") / n,  # streaming makes no batched calls
        "transitions_per_second": transitions / wall,
        "generated_tokens_per_sample": engine(runs, "generated_tokens") / n,  # aborted and stopped requests' tokens included
        "tokens_vs_serial_off": (
            engine(runs, "generated_tokens") / max(engine(baseline, "generated_tokens"), 1) if baseline and baseline_is_off else None
        ),
        "early_stopped_per_sample": stat(runs, "early_stopped_requests") / n,
        "early_stop_tokens_left_per_sample": stat(runs, "early_stop_tokens_left") / n,
        "early_rejected_steps_per_sample": stat(runs, "early_rejected_steps") / n,
        "early_stop_rerequests_per_sample": stat(runs, "early_stop_rerequests") / n,
        "aborted_per_sample": stat(runs, "aborted_requests") / n,
        "forked_per_sample": stat(runs, "forked_requests") / n,
        "cached_token_share": engine(runs, "cached_prompt_tokens") / max(engine(runs, "prompt_tokens"), 1),
        "peak_kv_cache_usage": max(peaks) if peaks else None,  # the largest of the samples' peaks
        "peak_kv_cache_usage_per_sample": [entry[3] for entry in runs],
        "acceptance_rate": stat(runs, "accepted") / max(transitions, 1),
        "same_as_serial": same(runs, baseline) if baseline else None,  # the baseline's tokens (serial off where it ran)
        "same_on_off": same(runs, other) if other is not None else None,
    }


class _Missing:
    """A cell with no figure (a ratio without its baseline, a gauge the engine lacks): "-"."""

    def __format__(self, spec: str) -> str:
        return "-"


def format_report(report: dict) -> str:
    rows = [{key: _Missing() if value is None else value for key, value in row.items()} for row in report["rows"]]
    return format_table(rows, COLUMNS)
