"""The in-process driver: one chain, one engine, a plain loop."""

from __future__ import annotations

import time
from typing import Sequence

from presto_ray.chain import Chain
from presto_ray.config import SamplerConfig
from presto_ray.engines.base import CallAccounting, Engine
from presto_ray.kernels import PowerMHKernel
from presto_ray.results import SampleResult, SampleStats


def run_chain(engine: Engine, chain: Chain) -> CallAccounting:
    """Drive `chain` to the end against `engine`; returns the summed engine accounting."""
    total = CallAccounting()
    while not chain.done:
        output = engine.generate(chain.plan())
        chain.advance(output.completions)
        total.add(output.accounting)
    return total


def sample(
    engine: Engine,
    prompt_token_ids: Sequence[int],
    config: SamplerConfig,
    *,
    kernel: PowerMHKernel | None = None,
) -> SampleResult:
    """Draw one power sample for `prompt_token_ids` (generated tokens only in the result)."""
    start = time.perf_counter()
    chain = Chain(prompt_token_ids, config, engine.eos_token_id, kernel=kernel)
    accounting = run_chain(engine, chain)
    s = chain.stats
    stats = SampleStats(
        model_calls=s.rounds,
        transitions=s.transitions,
        accepted=s.accepted,
        requests=s.requests,
        requests_used=s.requests_used,
        generated_tokens=s.generated_tokens,
        extensions=s.extensions,
        certain_edges=s.certain_edges,
        prompt_tokens=accounting.prompt_tokens,
        cached_prompt_tokens=accounting.cached_prompt_tokens,
        engine_time_s=accounting.wall_time_s,
        wall_time_s=time.perf_counter() - start,
    )
    return SampleResult(chain.output_token_ids, stats)
