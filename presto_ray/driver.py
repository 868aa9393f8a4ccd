"""In-process drivers: one chain (`sample`) or many chains sharing each engine call (`sample_many`),
in rounds or streaming (`SamplerConfig.schedule`)."""

from __future__ import annotations

import time
from typing import Callable, Sequence

from presto_ray.chain import Chain
from presto_ray.config import SamplerConfig
from presto_ray.rounds import ChainRounds
from presto_ray.engines.base import CallAccounting, Engine
from presto_ray.kernels import PowerMHKernel
from presto_ray.speculation import budget_by_load
from presto_ray.results import SampleResult
from presto_ray.streaming import run_streaming


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
    schedules = {c.schedule for c in configs}
    if schedules == {"streaming"}:
        return _sample_streaming(engine, prompts, configs, max_active_chains, kernel_factory, on_result)
    if len(schedules) > 1:
        raise ValueError("one schedule per call: the chains of a call share either rounds or a stream")
    limit = max_active_chains or len(prompts)
    pending = list(range(len(prompts)))[::-1]
    active: list[tuple[int, ChainRounds, float]] = []  # (input index, the chain's book, start time)
    results: list[SampleResult | None] = [None] * len(prompts)
    total = CallAccounting()

    def finish(index: int, chain: Chain, started: float) -> None:
        result = results[index] = chain.result(time.perf_counter() - started)
        if on_result:
            on_result(index, result)

    while pending or active:
        while pending and len(active) < limit:
            i = pending.pop()
            kernel = kernel_factory(configs[i]) if kernel_factory else None
            chain = Chain(prompts[i], configs[i], engine.eos_token_id, kernel=kernel)
            if chain.done:  # e.g. mh_steps == 0 and nothing to extend
                finish(i, chain, time.perf_counter())
            else:
                active.append((i, ChainRounds(chain), time.perf_counter()))
        if not active:
            continue
        # each chain's share of the device's free batch: at load a round asks what serial asks
        batch = engine.free_batch
        plans = [rounds.plan(budget_by_load(rounds.chain.config.prefetch_budget, len(active), batch)) for _, rounds, _ in active]
        output = engine.generate([request for plan in plans for request in plan.requests])
        total.add(output.accounting)
        offset = 0
        still_active = []
        for (i, rounds, started), plan in zip(active, plans):
            rounds.advance(plan, output.completions[offset : offset + len(plan.requests)])
            offset += len(plan.requests)
            if rounds.done:
                finish(i, rounds.chain, started)
            else:
                still_active.append((i, rounds, started))
        active = still_active
    return _all_finished(results), total


def _sample_streaming(
    engine: Engine,
    prompts: Sequence[Sequence[int]],
    configs: Sequence[SamplerConfig],
    max_active_chains: int | None,
    kernel_factory: Callable[[SamplerConfig], PowerMHKernel] | None,
    on_result: Callable[[int, SampleResult], None] | None,
) -> tuple[list[SampleResult], CallAccounting]:
    """Every chain streams on the engine's streaming form (docs/streaming.md), at most
    `max_active_chains` at once, so that results land as chains finish, not all at the end."""
    stream = engine.streaming()
    started = time.perf_counter()
    chains = [
        Chain(p, c, engine.eos_token_id, kernel=kernel_factory(c) if kernel_factory else None)
        for p, c in zip(prompts, configs)
    ]
    results: list[SampleResult | None] = [None] * len(chains)
    chain_started = [started] * len(chains)

    def on_started(i: int) -> None:
        chain_started[i] = time.perf_counter()

    def finished(i: int) -> None:
        result = results[i] = chains[i].result(time.perf_counter() - chain_started[i])
        if on_result:
            on_result(i, result)

    run_streaming(stream, chains, finished, max_active_chains=max_active_chains, on_started=on_started)
    accounting = stream.accounting()
    accounting.wall_time_s = time.perf_counter() - started  # no calls to time: the whole stream
    return _all_finished(results), accounting


def _all_finished(results: list[SampleResult | None]) -> list[SampleResult]:
    """The results once every chain has one (a driver that returns earlier has a bug)."""
    missing = [i for i, result in enumerate(results) if result is None]
    if missing:
        raise RuntimeError(f"chains {missing[:5]} have no result")
    return [result for result in results if result is not None]


def sample(
    engine: Engine,
    prompt_token_ids: Sequence[int],
    config: SamplerConfig,
    *,
    kernel: PowerMHKernel | None = None,
) -> SampleResult:
    """Draw one power sample for `prompt_token_ids` (generated tokens only in the result)."""
    results, _ = sample_many(engine, [prompt_token_ids], [config], kernel_factory=(lambda _: kernel) if kernel else None)
    return results[0]


def run_chain(engine: Engine, chain: Chain) -> CallAccounting:
    """Drive one already-built chain to the end (tests use it to inspect the chain afterwards)."""
    if chain.config.schedule == "streaming":
        stream = engine.streaming()
        run_streaming(stream, [chain])
        return stream.accounting()
    total = CallAccounting()
    rounds = ChainRounds(chain)
    while not rounds.done:
        plan = rounds.plan()
        output = engine.generate(plan.requests)
        rounds.advance(plan, output.completions)
        total.add(output.accounting)
    return total
