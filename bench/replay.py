"""A real engine replayed on a measured device: its completions on the virtual clock's time.

The load tables of the virtual clock (bench/virtual_clock_load.py) run the toy's law with their
own sampler, so they cannot be compared with a load measured on vLLM setting for setting. Here
the same bench (bench/real_load.py: the same prompts, seeds, settings and chain counts) runs on a
`VirtualClockEngine` whose model is the real engine behind `RememberingEngine`: every request's
completion is the real model's (computed once, in batches: the clock asks for all the requests
submitted since its last step in one call), and time is what the measured `DeviceCurve` charges
for the decode steps the schedule makes, the prompt tokens a prefix cache would miss and the
host's work per event. Its speedups over serial chains are a prediction of the measured ones.

`RememberingEngine` also keeps the prefix cache the clock charges for: vLLM's, as the job config
sets it up (blocks of `cache_block_size` tokens, full blocks only, the last block of a context
always computed again for its logits), never emptied (the real bench does not empty vLLM's).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from presto_ray.engines.base import CallAccounting, Completion, Engine, EngineOutput, ProposalRequest
from presto_ray.engines.device_curve import DeviceCurve
from presto_ray.engines.virtual_clock import VirtualClockEngine


class RememberingEngine:
    """`engine`'s completions, each computed once (a request is a pure function of its fields),
    with the prefix cache a real engine would have had in the order the requests came."""

    def __init__(self, engine: Engine, cache_block_size: int) -> None:
        if cache_block_size < 1:
            raise ValueError("cache_block_size must be at least 1")
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.eos_token_id = engine.eos_token_id
        self.model_name = engine.model_name
        self.context_length = engine.context_length
        self.cache_block_size = cache_block_size
        self._completions: dict[ProposalRequest, Completion] = {}
        self._cached: set[tuple[int, ...]] = set()  # contexts of whole blocks held in the cache
        self.model_calls = 0  # calls of `engine`
        self.model_requests = 0  # requests `engine` computed

    def generate(self, requests: Sequence[ProposalRequest]) -> EngineOutput:
        keys = [replace(r, rejection_bounds=()) for r in requests]  # bounds only stop a request early
        missing = list(dict.fromkeys(k for k in keys if k not in self._completions))
        if missing:
            output = self.engine.generate(missing)
            self.model_calls += 1
            self.model_requests += len(missing)
            self._completions.update(zip(missing, output.completions))
        accounting = CallAccounting(calls=1, num_requests=len(requests))
        completions = []
        for key in keys:
            completion = self._completions[key]
            context = key.context_token_ids
            cached = self._cached_prefix(context)
            self._remember(context + completion.token_ids)
            accounting.prompt_tokens += len(context)
            accounting.cached_prompt_tokens += cached
            accounting.generated_tokens += len(completion.token_ids)
            completions.append(replace(completion, cached_prompt_tokens=cached))
        return EngineOutput(completions, accounting)

    def _cached_prefix(self, context: tuple[int, ...]) -> int:
        """Tokens of `context` read from the cache: its leading whole blocks held there, short of
        its last token (whose logits must be computed)."""
        block, cached = self.cache_block_size, 0
        while cached + block <= len(context) - 1 and context[: cached + block] in self._cached:
            cached += block
        return cached

    def _remember(self, tokens: tuple[int, ...]) -> None:
        block = self.cache_block_size
        for end in range(block, len(tokens) + 1, block):
            self._cached.add(tokens[:end])

    def shutdown(self) -> None:
        """The real engine is its caller's to stop."""


def replayed(engine: Engine, curve: DeviceCurve, *, cache_block_size: int, max_running: int | None) -> VirtualClockEngine:
    """`engine` on the virtual clock of `curve`, with `engine`'s own free batch (the budget rule
    shares what the real engine would) and at most `max_running` sequences at once."""
    return VirtualClockEngine(
        RememberingEngine(engine, cache_block_size),  # type: ignore[arg-type]
        device=curve,
        max_running=max_running,
        speculation_batch=engine.free_batch,
    )
