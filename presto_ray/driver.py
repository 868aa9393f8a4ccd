"""In-process drivers: one chain (`sample`) or many chains sharing each engine call (`sample_many`)."""

from __future__ import annotations

import time
from typing import Callable, Sequence

from presto_ray.chain import Chain
from presto_ray.config import SamplerConfig
from presto_ray.engines.base import CallAccounting, Completion, Engine, ProposalRequest
from presto_ray.kernels import PowerMHKernel
from presto_ray.results import SampleResult, SampleStats


class ChainRun:
    """One running chain plus what its calls cost: the bookkeeping every driver shares."""

    def __init__(self, chain: Chain) -> None:
        self.chain = chain
        self.started = time.perf_counter()
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0

    def advance(self, plan: Sequence[ProposalRequest], completions: Sequence[Completion]) -> None:
        self.prompt_tokens += sum(len(r.context_token_ids) for r in plan)
        self.cached_prompt_tokens += sum(c.cached_prompt_tokens for c in completions)
        self.chain.advance(completions)

    def result(self) -> SampleResult:
        s = self.chain.stats
        stats = SampleStats(
            model_calls=s.rounds,
            transitions=s.transitions,
            accepted=s.accepted,
            requests=s.requests,
            requests_used=s.requests_used,
            generated_tokens=s.generated_tokens,
            extensions=s.extensions,
            certain_edges=s.certain_edges,
            prompt_tokens=self.prompt_tokens,
            cached_prompt_tokens=self.cached_prompt_tokens,
            wall_time_s=time.perf_counter() - self.started,
        )
        return SampleResult(self.chain.output_token_ids, stats)


def sample_many(
    engine: Engine,
    prompts: Sequence[Sequence[int]],
    configs: Sequence[SamplerConfig],
    *,
    max_active_chains: int | None = None,
    kernel_factory: Callable[[SamplerConfig], PowerMHKernel] | None = None,
    on_result: Callable[[int, SampleResult], None] | None = None,
) -> tuple[list[SampleResult], CallAccounting]:
    """Run one chain per (prompt, config); each round, every active chain's requests share one call.

    A chain's samples do not depend on which chains share its calls (keyed randomness), only the
    number of engine calls does. Returns the results in input order and the engine's accounting.
    """
    if len(prompts) != len(configs):
        raise ValueError("one config per prompt")
    limit = max_active_chains or len(prompts)
    pending = list(range(len(prompts)))[::-1]
    active: list[tuple[int, ChainRun]] = []
    results: list[SampleResult | None] = [None] * len(prompts)
    total = CallAccounting()

    def finish(index: int, run: ChainRun) -> None:
        results[index] = run.result()
        if on_result:
            on_result(index, results[index])

    while pending or active:
        while pending and len(active) < limit:
            i = pending.pop()
            kernel = kernel_factory(configs[i]) if kernel_factory else None
            run = ChainRun(Chain(prompts[i], configs[i], engine.eos_token_id, kernel=kernel))
            if run.chain.done:  # e.g. mh_steps == 0 and nothing to extend
                finish(i, run)
            else:
                active.append((i, run))
        if not active:
            continue
        plans = [run.chain.plan() for _, run in active]
        output = engine.generate([request for plan in plans for request in plan])
        total.add(output.accounting)
        offset = 0
        still_active = []
        for (i, run), plan in zip(active, plans):
            completions = output.completions[offset : offset + len(plan)]
            offset += len(plan)
            run.advance(plan, completions)
            if run.chain.done:
                finish(i, run)
            else:
                still_active.append((i, run))
        active = still_active
    return results, total


def sample(
    engine: Engine,
    prompt_token_ids: Sequence[int],
    config: SamplerConfig,
    *,
    kernel: PowerMHKernel | None = None,
) -> SampleResult:
    """Draw one power sample for `prompt_token_ids` (generated tokens only in the result)."""
    results, accounting = sample_many(
        engine, [prompt_token_ids], [config], kernel_factory=(lambda _: kernel) if kernel else None
    )
    results[0].stats.engine_time_s = accounting.wall_time_s
    return results[0]


def run_chain(engine: Engine, chain: Chain) -> CallAccounting:
    """Drive one already-built chain to the end (tests use it to inspect the chain afterwards)."""
    total = CallAccounting()
    while not chain.done:
        output = engine.generate(chain.plan())
        chain.advance(output.completions)
        total.add(output.accounting)
    return total
