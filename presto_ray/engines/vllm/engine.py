"""VLLMEngine: the engine contract (presto_ray/engines/base.py) over vLLM's AsyncLLM, with exact
log p0 and log q_tau.

The engine is three parts: the runtime (runtime.py: AsyncLLM on its event-loop thread), the codec
(codec.py: requests to SamplingParams, outputs to Completions; where log p0 comes from is
explained there) and the two forms that use both: `generate` here (rounds, serial), and
`streaming()` (streaming.py: per-request streams).

vLLM starts worker processes with `spawn`: create the engine from a `__main__` guard, a test, or
an actor, never at import time of a script's main module.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Sequence

from presto_ray.engines.base import CallAccounting, EngineOutput, ProposalRequest
from presto_ray.engines.vllm.codec import RequestOutput, TokenReader, VLLMCodec, scored_tokens
from presto_ray.engines.vllm.settings import VLLMEngineConfigBase
from presto_ray.engines.vllm.runtime import VLLMRuntime, set_cpu_environment
from presto_ray.engines.vllm.streaming import VLLMStreamingEngine
from presto_ray.engines.vllm.tokenizer import HFTokenizer, resolve_model_dir


class VLLMEngine:
    """One vLLM AsyncLLM on a private event-loop thread; `generate` is the batch call."""

    def __init__(self, config: VLLMEngineConfigBase | None = None) -> None:
        from presto_ray.models import set_offline_environment

        self.config = config = config or VLLMEngineConfigBase()
        set_offline_environment()
        set_cpu_environment(config)
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # vLLM's INFO lines drown the progress bar
        self.model_dir = str(resolve_model_dir(config))
        self.runtime = VLLMRuntime(config, self.model_dir)
        self.startup_time_s = self.runtime.startup_time_s
        self.tokenizer = HFTokenizer(self.runtime.llm.get_tokenizer(), config.chat_template_for_prompts)
        self.eos_token_id: int | None = self.tokenizer.eos_token_id
        self.max_model_len = config.max_model_len
        self.context_length = config.context_length  # the scoring pass needs one token more than max_model_len
        self.model_name = config.model_name
        self.codec = VLLMCodec(
            eos_token_id=self.eos_token_id,
            max_model_len=self.max_model_len,
            context_length=self.context_length,
            scores_separately=config.logp0_from == "scoring_pass",
        )

    # --- the engine contract -----------------------------------------------------------------
    @property
    def free_batch(self) -> float:
        return float(self.config.free_batch)

    def generate(self, requests: Sequence[ProposalRequest]) -> EngineOutput:
        return self.runtime.run(self._generate(list(requests)))

    async def agenerate(self, requests: Sequence[ProposalRequest]) -> EngineOutput:
        """The same, awaitable from any event loop (for Ray actors)."""
        return await self.runtime.run_async(self._generate(list(requests)))

    def streaming(self) -> VLLMStreamingEngine:
        """This engine's per-request form: completion events, partial tokens, abort, priority."""
        return VLLMStreamingEngine(self.runtime, self.codec, free_batch=self.free_batch)

    def validate(self, request: ProposalRequest) -> None:
        """Raise ValueError for a request vLLM could not serve (codec.py's `validate`)."""
        self.codec.validate(request)

    def score(self, request: ProposalRequest, tokens: Sequence[int]) -> RequestOutput:
        """The scoring pass's output for `tokens` after the request's context (tests compare it
        with the sampler's log p0)."""
        return self.runtime.run(self.runtime.score(self.codec, request, tokens))

    async def _generate(self, requests: list[ProposalRequest]) -> EngineOutput:
        """Every request at once on the runtime (vLLM batches them). A request that carries
        rejection bounds streams DELTA outputs so that it stops the moment every bound rejects
        (exact early rejection: the round, or the serial step, waits less); the others read their
        FINAL output only. Both through `VLLMRuntime.sample`, as the streaming form does."""
        start = time.perf_counter()
        for request in requests:
            self.codec.validate(request)
        runtime, codec = self.runtime, self.codec
        readers = [TokenReader(codec, request) for request in requests]
        live = [i for i, request in enumerate(requests) if request.max_new_tokens > 0]  # others never reach vLLM
        await asyncio.gather(*[runtime.sample(readers[i]) for i in live])
        scoring_start = time.perf_counter()
        scored = await asyncio.gather(*[runtime.score_if_separate(codec, requests[i], readers[i].tokens) for i in live])
        scores: list[RequestOutput | None] = [None] * len(requests)
        for i, score in zip(live, scored):
            scores[i] = score
        accounting = CallAccounting(calls=1, num_requests=len(requests), scoring_time_s=time.perf_counter() - scoring_start)
        completions = [reader.completion(score) for reader, score in zip(readers, scores)]
        for i in live:
            accounting.prompt_tokens += len(requests[i].context_token_ids)
            accounting.cached_prompt_tokens += completions[i].cached_prompt_tokens
            accounting.generated_tokens += readers[i].decoded  # what vLLM decoded, past an early stop too
            accounting.scoring_tokens += scored_tokens(scores[i])
        accounting.wall_time_s = time.perf_counter() - start
        return EngineOutput(completions, accounting)

    # --- lifecycle -----------------------------------------------------------------------------
    def shutdown(self) -> None:
        self.runtime.shutdown()

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
