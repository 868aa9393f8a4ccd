"""`presto-ray validate`: does the prefetching schedule sample the serial chain's law on this model?

On deterministic engines prefetching replays the serial chain token for token (the identity
tests). On a GPU, kernels are not batch-invariant: a token can flip between a batched and an
unbatched call, so only the law can be compared. This module runs the two sides (serial PowerMH
and the config's schedule, on the same prompts, independent seeds) and builds the report; the
modules beside it hold the parts:

- `validate_stats.py`: the statistics compared per sample (mean log p0 per token, length,
  alpha * log p0(x), the acceptance rate, the EOS rate), TOST and the difference test, margins;
- `validate_fault.py`: the fault (`fault=True`: the prefetching side's kernel without the
  length correction) and the power against it, from the serial side's recorded MH decisions;
- `validate_report.py`: the rows, the verdict, the table and the JSON.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from presto_ray.backend import Backend
from presto_ray.config import SamplerConfig
from presto_ray.keys import derive_seed
from presto_ray.kernels import PowerMHKernel
from presto_ray.results import SampleResult
from presto_ray.validate_audit import DecisionAudit
from presto_ray.validate_fault import FEASIBLE_SAMPLES, DecisionRecorder, fault_power, faulty_kernel
from presto_ray.validate_report import ValidationReport
from presto_ray.validate_stats import (
    DEFAULT_ALPHA_LEVEL, POWER_TARGET, STATISTICS, Margins, compare_statistic, samples_needed,
)  # fmt: skip

MAX_GROWTHS = 4  # times the serial side may grow towards it (each growth refines the prediction)


def sample_statistics(result: SampleResult, alpha: float, eos_token_id: int | None = None) -> dict[str, float]:
    logp0 = np.asarray(result.logp0, dtype=float)
    length = len(result.token_ids)
    return {
        "mean_logp0": float(logp0.mean()) if length else 0.0,
        "length": float(length),
        "alpha_logp0": float(alpha * logp0.sum()),
        "acceptance_rate": result.stats.acceptance_rate,
        "eos": float(length > 0 and eos_token_id is not None and result.token_ids[-1] == eos_token_id),
    }


def _run_side(
    backend: Backend, prompts: Sequence[tuple[str, Sequence[int]]], side_config: SamplerConfig, s: int, seed: int,
    chains: range, alpha: float, kernel_factory: Callable[[SamplerConfig], PowerMHKernel] | None,
) -> tuple[list[dict], tuple[int, int]]:
    """Chains `chains` of every prompt on side s (seed derive_seed(seed, s, i, c)): their statistics,
    and the MH steps they decided and early-rejected."""
    work = [(pid, tokens, i, c) for i, (pid, tokens) in enumerate(prompts) for c in chains]
    seeds = [derive_seed(seed, s, i, c) for _, _, i, c in work]
    results = backend.sample(
        [tokens for _, tokens, _, _ in work], [side_config.model_copy(update={"seed": x}) for x in seeds], kernel_factory=kernel_factory
    )
    eos = backend.tokenizer.eos_token_id
    rows = [{"prompt_id": pid, "chain": c, "seed": x, **sample_statistics(r, alpha, eos)} for (pid, _, _, c), x, r in zip(work, seeds, results)]
    return rows, (sum(r.stats.transitions for r in results), sum(r.stats.early_rejected_steps for r in results))


def _in_prompt_order(rows: list[dict], prompts: Sequence[tuple[str, Sequence[int]]]) -> list[dict]:
    order = {pid: i for i, (pid, _) in enumerate(prompts)}
    return sorted(rows, key=lambda r: (order[r["prompt_id"]], r["chain"]))


def run_validation(
    backend: Backend,
    prompts: Sequence[tuple[str, Sequence[int]]],
    config: SamplerConfig,
    *,
    chains_per_prompt: int,
    max_chains_per_prompt: int | None = None,
    margins: Margins = Margins(),
    alpha_level: float = DEFAULT_ALPHA_LEVEL,
    fault: bool = False,
    reference: Backend | None = None,
    progress: Callable[[str], None] | None = None,
) -> ValidationReport:
    """Serial PowerMH vs `config`'s schedule on `prompts` ((id, token ids) pairs), independent seeds.

    Chain c of prompt i on side s has seed derive_seed(config.seed, s, i, c): the two sides never
    share a seed, and a rerun draws the same samples. The serial side runs first, recording its
    MH decisions (its kernel is the config's, without early rejection, so every step's ratio is
    known): the power against the fault follows from them. With `max_chains_per_prompt` above
    `chains_per_prompt`, a run whose power against the fault is below POWER_TARGET is extended to
    the chains that reach it, where at most that many do (the serial side's next chains, then the
    prefetching side at the final count). The prefetching side's kernel is audited: every step it
    decides is decided again by the config's kernel (validate_audit.py), a disagreement a verdict.
    `reference`: the serial side runs on this backend (another engine, validate_reference.py, which
    the caller has checked for the same law and the same prompt tokens) instead of `backend`.
    """
    import time

    if config.traversal == "serial":
        raise ValueError("the config's traversal is 'serial': nothing to compare; use bfs or predictive")
    if chains_per_prompt * len(prompts) < 2:
        raise ValueError("validate needs at least two samples per side (prompts x chains)")
    sides = {
        "serial": config.model_copy(update={"traversal": "serial", "schedule": "rounds", "prefetch_budget": 1}),
        "prefetch": config,
    }
    notes = []
    if fault and config.fixed_length:
        notes.append("fixed_length: every state has the horizon's length, so the fault changes nothing")
    level = alpha_level / len(STATISTICS)  # each difference test's share (Bonferroni)
    recorder = DecisionRecorder()
    start = time.perf_counter()
    if progress:
        progress(f"serial: {chains_per_prompt * len(prompts)} chains")
    serial_backend = reference if reference is not None else backend
    serial, _ = _run_side(serial_backend, prompts, sides["serial"], 0, config.seed, range(chains_per_prompt), config.alpha, recorder)
    chains = chains_per_prompt
    power = fault_power(serial, [recorder.by_seed.get(r["seed"], []) for r in serial], chains * len(prompts), level)
    # grown while the prediction (refined by each growth's chains) says more chains reach the target
    for _ in range(MAX_GROWTHS):
        needed = power.samples_needed
        if max_chains_per_prompt is None or needed is None or power.power >= POWER_TARGET:
            break
        wanted = max(chains + 1, math.ceil(needed / len(prompts)))
        if wanted > max_chains_per_prompt:
            if needed <= FEASIBLE_SAMPLES:  # beyond that the power line says it: no run would do
                notes.append(f"about {needed} samples per side would give {POWER_TARGET:.0%} power against the fault; "
                             f"at most {max_chains_per_prompt * len(prompts)} were allowed (--max-samples)")  # fmt: skip
            break
        if progress:
            progress(f"serial: {(wanted - chains) * len(prompts)} more chains: about {needed} samples per side give "
                     f"{POWER_TARGET:.0%} power against the fault (predicted from the serial chains' decisions)")  # fmt: skip
        more, _ = _run_side(serial_backend, prompts, sides["serial"], 0, config.seed, range(chains, wanted), config.alpha, recorder)
        serial, chains = _in_prompt_order(serial + more, prompts), wanted
        power = fault_power(serial, [recorder.by_seed.get(r["seed"], []) for r in serial], chains * len(prompts), level)
    wall = {"serial": time.perf_counter() - start}
    if progress:
        progress(f"prefetch: {chains * len(prompts)} chains")
    start = time.perf_counter()
    audit = DecisionAudit()  # every step the prefetching side decides, decided again by the config's kernel
    prefetch, totals = _run_side(backend, prompts, sides["prefetch"], 1, config.seed, range(chains), config.alpha,
                                 audit.factory(faulty_kernel if fault else None))  # fmt: skip
    wall["prefetch"] = time.perf_counter() - start
    samples = {"serial": serial, "prefetch": prefetch}
    n = len(serial)
    half_width = 1.6449 * math.sqrt(2.0 / n)  # in pooled sd, large-sample quantile at alpha 0.05
    if not margins.absolute and half_width > 0.6 * margins.sd:
        notes.append(
            f"{n} samples per side: a 90% interval spans about ±{half_width:.2f} sd, so even equal laws pass a "
            f"{margins.sd:g} sd margin only while the observed difference stays below {max(0.0, margins.sd - half_width):.2f} sd; "
            f"about {samples_needed(margins)} samples per side give equal laws a 95% chance per statistic"
        )
    if power.power < POWER_TARGET:
        notes.append(
            f"power against the fault is {power.power:.2f}: the law tests of this run cannot reliably tell the fault from a "
            f"correct kernel (it changes {power.flips_per_chain:.3g} MH decisions per chain on this config); the decision "
            f"audit checks the kernel itself, exactly"
        )
    rows = [compare_statistic(name, serial, prefetch, margins, alpha_level, level) for name in STATISTICS]
    return ValidationReport(
        config=config.model_dump(),
        prompts=[pid for pid, _ in prompts],
        chains_per_prompt=chains,
        alpha_level=alpha_level,
        fault=fault,
        rows=rows,
        samples=samples,
        wall_time_s=wall,
        notes=notes,
        power=power.to_json(),
        audit=audit.to_json(*totals),
    )
