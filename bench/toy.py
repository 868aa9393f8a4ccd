"""Toy benchmark: serial PowerMH against PreSTO prefetching, side by side on a ToyEngine."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TypedDict

from bench.table import Columns, format_table
from presto_ray import __version__
from presto_ray.config import SamplerConfig
from presto_ray.driver import sample
from presto_ray.engines.toy import ToyEngine
from presto_ray.output import write_json_atomic
from presto_ray.results import SampleResult



class ToyEngineSettings(TypedDict):
    vocab_size: int
    eos_token_id: int
    seed: int
    logit_scale: float
    eos_bias: float


# A peaked, LLM-like toy model: most MH decisions land near 0 or 1.
TOY_ENGINE: ToyEngineSettings = {"vocab_size": 64, "eos_token_id": 0, "seed": 1, "logit_scale": 4.0, "eos_bias": -3.0}

COLUMNS: Columns = [
    ("sampler", "sampler", "{}"),
    ("traversal", "traversal", "{}"),
    ("budget", "budget", "{}"),
    ("transitions_per_call", "trans/call", "{:.2f}"),
    ("calls_per_sample", "calls/sample", "{:.1f}"),
    ("requests_per_call", "req/call", "{:.2f}"),
    ("useful_request_share", "useful req", "{:.1%}"),
    ("generated_tokens_per_sample", "gen tok/sample", "{:.0f}"),
    ("acceptance_rate", "accept", "{:.1%}"),
    ("certain_edge_share", "certain edges", "{:.1%}"),
    ("calls_vs_serial", "calls vs serial", "{:.3f}"),
    ("same_as_serial", "same as serial", "{}"),
]


def chain_prompt(chain: int) -> list[int]:
    return [5, 6, 7 + chain]


VARIANT_SETTINGS = {"power_mh": {}, "entropy_cut": {}, "multi_try": {"num_tries": 4}}


def _run(
    traversal: str, budget: int, num_chains: int, base: SamplerConfig, seed: int, gain: float = 0.0, sampler: str = "power_mh"
) -> list[SampleResult]:
    """Sample `num_chains` chains with one sampler, traversal and budget on a fresh toy engine."""
    engine = ToyEngine(**TOY_ENGINE)
    update = {"prefetch_budget": budget, "traversal": traversal, "min_expected_gain": gain, "sampler": sampler}
    update.update(VARIANT_SETTINGS[sampler])
    return [sample(engine, chain_prompt(c), base.model_copy(update={**update, "seed": seed + c})) for c in range(num_chains)]


def _row(sampler: str, traversal: str, budget: int, gain: float, results: list[SampleResult], serial: list[SampleResult]) -> dict:
    """Aggregate one (traversal, budget) run into a table row."""

    def total(field: str, of: list[SampleResult] = results) -> int:
        return sum(getattr(r.stats, field) for r in of)

    calls, transitions, requests = total("rounds"), total("transitions"), total("requests")
    return {
        "sampler": sampler,
        "traversal": traversal if not gain else f"{traversal} gain>={gain:g}",
        "budget": budget,
        "min_expected_gain": gain,
        "transitions_per_call": transitions / calls,
        "calls_per_sample": calls / len(results),
        "requests_per_call": requests / calls,
        "useful_request_share": total("requests_used") / requests,
        "generated_tokens_per_sample": total("generated_tokens") / len(results),
        "acceptance_rate": total("accepted") / transitions if transitions else 0.0,
        "certain_edge_share": total("certain_edges") / transitions if transitions else 0.0,
        "calls_vs_serial": calls / total("rounds", serial),
        "same_as_serial": all(r.token_ids == s.token_ids for r, s in zip(results, serial, strict=True)),
    }


def run_toy_bench(
    budgets: Sequence[int] = (8, 10, 12, 16, 20),
    traversals: Sequence[str] = ("serial", "bfs", "predictive"),
    num_chains: int = 8,
    mh_steps: int = 100,
    block_size: int = 64,
    seed: int = 0,
    out_json: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
    predictive_gains: Sequence[float] = (0.0, 0.1),
    variant_budgets: Sequence[int] = (8, 20),
) -> dict:
    """Run every (sampler, traversal, budget) on the same chains; serial is one row, budget 1.

    PowerMH runs every budget (and predictive with each gain); EntropyCut and MultiTryMH run
    `variant_budgets`. Per sampler, a reference serial run comes first; the serial row is a
    second, independent run, so its `same_as_serial` checks run-to-run determinism.
    """
    base = SamplerConfig(block_size=block_size, num_blocks=1, mh_steps=mh_steps, schedule="rounds")
    runs = [
        ("power_mh", t, b, g)
        for t in traversals
        for g in (predictive_gains if t == "predictive" else [0.0])
        for b in ([1] if t == "serial" else budgets)
    ]
    runs += [
        (v, t, b, 0.0)
        for v in ("entropy_cut", "multi_try")
        for t in traversals
        for b in ([1] if t == "serial" else variant_budgets)
    ]
    serial = {v: _run("serial", 1, num_chains, base, seed, sampler=v) for v in VARIANT_SETTINGS}
    rows = []
    for sampler, traversal, budget, gain in runs:
        results = _run(traversal, budget, num_chains, base, seed, gain, sampler)
        row = _row(sampler, traversal, budget, gain, results, serial[sampler])
        rows.append(row)
        if progress is not None:
            progress(
                f"{sampler} {row['traversal']} budget={budget}: {row['calls_per_sample']:.1f} calls/sample, "
                f"same_as_serial={row['same_as_serial']}"
            )
    report = {
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": {
            "presto_ray_version": __version__,
            "engine": {"kind": "toy", **TOY_ENGINE},
            "prompt": "[5, 6, 7 + chain]",
            "num_chains": num_chains,
            "seed": seed,
            "chain_seeds": "seed + chain",
            "budgets": list(budgets),
            "traversals": list(traversals),
            "predictive_gains": list(predictive_gains),
            "variant_budgets": list(variant_budgets),
            "variant_settings": VARIANT_SETTINGS,
            "sampler": base.model_dump(exclude={"prefetch_budget", "traversal", "seed", "min_expected_gain", "sampler", "num_tries"}),
        },
        "rows": rows,
    }
    if out_json is not None:
        write_json_atomic(report, out_json)
    return report


def format_report(report: dict) -> str:
    return format_table(report["rows"], COLUMNS)
