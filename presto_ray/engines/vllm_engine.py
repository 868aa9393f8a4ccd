"""VLLMEngine: the engine protocol over vLLM's AsyncLLM, with exact log p0 and log q_tau.

Log-probabilities. vLLM returns one kind of log-probability per engine (`logprobs_mode` is
engine-wide). The engine runs in `processed_logprobs` mode, so a proposal's sampled tokens come
back with log q_tau, the law they were drawn from (temperature only: top-k, top-p and min-p are
off). Log p0 comes from one of two places (`VLLMEngineConfig.logp0_from`):

- `sampler` (the default): vLLM's sampler, wrapped in its worker (vllm_sampler_patch.py),
  returns log p0 and the entropy of p0 of each sampled token beside log q_tau, in the same pass.
  Measured on 2 CPU cores with SmolLM2: within 1e-5 of the scoring pass, the same tokens.
- `scoring_pass`: the same engine prefills prompt + prefix + completion at temperature 1 with
  `prompt_logprobs=0`, which returns log p0 of every completion token. vLLM skips the prefix
  cache for such requests (cached rows carry no log-probabilities), so scoring costs a full
  prefill; `CallAccounting.scoring_tokens` and `scoring_time_s` report it.

Both are exact for the model as vLLM computes it; they differ from another implementation
(transformers) only by floating-point round-off, which the conformance suite bounds.

Entropies (EntropyCut). With `sampler` they come with the tokens. With `scoring_pass`, a request
with `want_entropy` is scored with `prompt_logprobs=-1`, the whole vocabulary per position (the
engine runs with `max_logprobs=-1`), and the entropy of p0 is summed from it: exact, and
expensive (8 requests of 48 tokens took 18.6 s to score against 2.6 s without entropies),
because vLLM ships every probability back to the front end.

Seeds. Every request carries its own seed (the chain's step key), so a proposal is a function of
(seed, prompt + prefix) and never depends on which other requests share the batch.

vLLM starts worker processes with `spawn`: create the engine from a `__main__` guard, a test, or
an actor, never at import time of a script's main module.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Sequence

import numpy as np

from presto_ray.engines.base import CallAccounting, Completion, EngineOutput, ProposalRequest
from presto_ray.engines.specs import VLLMEngineConfig
from presto_ray.engines.vllm_sampler_columns import (
    ENTROPY_COLUMN,
    EXTENSION_QUALNAME,
    LOGP0_COLUMN,
    LOGQ_COLUMN,
    SAMPLER_COLUMNS,
    sampler_columns,
)

if TYPE_CHECKING:
    from presto_ray.engines.vllm_streaming import VLLMStreamingEngine


def _set_cpu_environment(config: VLLMEngineConfig) -> None:
    if config.cpu_threads_bind is not None:
        bind = f"0-{(os.cpu_count() or 1) - 1}" if config.cpu_threads_bind == "all" else config.cpu_threads_bind
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", bind)
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")


class HFTokenizer:
    """Text and chat messages to token ids with the model's own tokenizer and chat template."""

    def __init__(self, tokenizer, use_chat_template: bool) -> None:
        self._tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id
        self.vocab_size = len(tokenizer)
        self.has_chat_template = bool(getattr(tokenizer, "chat_template", None))
        self.use_chat_template = use_chat_template and self.has_chat_template

    def encode(self, text: str) -> list[int]:
        if self.use_chat_template:
            return self.apply_chat_template([{"role": "user", "content": text}])
        return self.encode_raw(text)

    def encode_raw(self, text: str) -> list[int]:
        """The text as it is, never wrapped in the chat template (the completions API)."""
        return list(self._tokenizer.encode(text, add_special_tokens=True))

    def apply_chat_template(self, messages) -> list[int]:
        if not self.has_chat_template:
            return list(self._tokenizer.encode("".join(f"{m['role']}: {m['content']}\n" for m in messages)))
        text = self._tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids) -> str:
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=True)


def _entropies(flat, offset: int, count: int) -> np.ndarray:
    """Entropy of p0 at `count` positions from whole-vocabulary flat prompt logprobs.

    Each position lists the prompt token first and then every vocabulary entry, so the prompt
    token appears twice: keep the first occurrence of each id. Only the completion's positions
    are converted (the prompt's are as long and unused).
    """
    if count == 0:
        return np.zeros(0)
    begin, end = flat.start_indices[offset], flat.end_indices[offset + count - 1]
    token_ids = np.asarray(flat.token_ids[begin:end])
    logprobs = np.asarray(flat.logprobs[begin:end], dtype=np.float64)
    out = np.empty(count)
    for i in range(count):
        a, b = flat.start_indices[offset + i] - begin, flat.end_indices[offset + i] - begin
        _, first = np.unique(token_ids[a:b], return_index=True)
        lp = logprobs[a:b][first]
        out[i] = float(-(np.exp(lp) * lp).sum())
    return out


def resolve_model_dir(config: VLLMEngineConfig):
    """The model folder `config` names, or the packaged SmolLM2 (converted on first use)."""
    from presto_ray.models import check_model_dir, prepare_smollm2

    return check_model_dir(config.model) if config.model else prepare_smollm2()


def load_tokenizer(config: VLLMEngineConfig) -> HFTokenizer:
    """The engine's tokenizer without starting vLLM (drivers encode prompts and decode samples)."""
    from transformers import AutoTokenizer

    from presto_ray.models import set_offline_environment

    set_offline_environment()
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_dir(config)))
    return HFTokenizer(tokenizer, config.chat_template_for_prompts)


class VLLMEngine:
    """One vLLM AsyncLLM on a private event-loop thread; `generate` is the engine protocol."""

    def __init__(self, config: VLLMEngineConfig | None = None) -> None:
        from presto_ray.models import set_offline_environment

        self.config = config = config or VLLMEngineConfig()
        set_offline_environment()
        _set_cpu_environment(config)
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # vLLM's INFO lines drown the progress bar
        self.model_dir = str(resolve_model_dir(config))
        self._ids = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine-loop", daemon=True)
        self._thread.start()
        start = time.perf_counter()
        self._llm = self._run(self._start())
        self.startup_time_s = time.perf_counter() - start
        self.tokenizer = HFTokenizer(self._llm.get_tokenizer(), config.chat_template_for_prompts)
        self.eos_token_id: int | None = self.tokenizer.eos_token_id
        self.max_model_len = config.max_model_len
        self.context_length = config.context_length  # the scoring pass needs one token more than max_model_len
        self.scores_separately = config.logp0_from == "scoring_pass"
        self.model_name = config.model_name

    async def _start(self):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        c = self.config
        args = AsyncEngineArgs(
            model=self.model_dir,
            dtype=c.dtype,
            enforce_eager=c.enforce_eager,
            block_size=c.kv_block_size,
            gpu_memory_utilization=c.gpu_memory_utilization,
            max_model_len=c.max_model_len,
            max_num_seqs=c.max_num_seqs,
            tensor_parallel_size=c.tensor_parallel_size,
            seed=c.seed,
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",
            scheduling_policy="priority",  # streaming: needed requests before speculation (FCFS within a level)
            max_logprobs=-1 if c.logp0_from == "scoring_pass" else SAMPLER_COLUMNS - 1,  # -1: entropies by scoring
            worker_extension_cls=EXTENSION_QUALNAME if c.logp0_from == "sampler" else "",
            generation_config="vllm",  # no sampling defaults from the model's files
            disable_log_stats=False,
        )
        return AsyncLLM.from_engine_args(args)

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    # --- the engine protocol --------------------------------------------------------------
    def generate(self, requests: Sequence[ProposalRequest]) -> EngineOutput:
        return self._run(self._generate(list(requests)))

    async def agenerate(self, requests: Sequence[ProposalRequest]) -> EngineOutput:
        """The same, awaitable from any event loop (for Ray actors)."""
        future: Future = asyncio.run_coroutine_threadsafe(self._generate(list(requests)), self._loop)
        return await asyncio.wrap_future(future)

    def validate(self, request: ProposalRequest) -> None:
        """Refuse a request vLLM could not serve: no context, or a scoring pass over max_model_len
        (it prefills context + completion and generates one token, so one slot more than sampling)."""
        context = len(request.context_token_ids)
        if context == 0:
            raise ValueError("a request needs at least one prompt or prefix token")
        if context + request.max_new_tokens > self.context_length:
            why = f" (max_model_len {self.max_model_len} less the scoring pass's one token)" if self.scores_separately else ""
            raise ValueError(
                f"prompt + prefix ({context}) + max_new_tokens ({request.max_new_tokens}) exceeds the context of "
                f"{self.context_length} tokens{why}"
            )

    async def _final(self, token_ids: list[int], params) -> object:
        final = None
        async for output in self.stream(token_ids, params, f"presto-{next(self._ids)}"):
            final = output
        return final

    def sampling_params(self, request: ProposalRequest, delta: bool = False):
        """q_tau exactly (temperature only), the request's own seed, log q_tau of each token (and,
        from the wrapped sampler, log p0 and the entropy: flat, as the sampler's columns)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            n=1,
            temperature=request.temperature,
            top_p=1.0,
            top_k=0,
            min_p=0.0,
            seed=request.seed,
            max_tokens=request.max_new_tokens,
            ignore_eos=not request.stop_at_eos,
            logprobs=0 if self.scores_separately else SAMPLER_COLUMNS - 1,
            flat_logprobs=not self.scores_separately,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA if delta else RequestOutputKind.FINAL_ONLY,
        )

    async def score(self, request: ProposalRequest, tokens: Sequence[int]):
        """The scoring pass: log p0 (and entropies when asked) of `tokens` after the request's context."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            temperature=1.0, max_tokens=1, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY,
            prompt_logprobs=-1 if request.want_entropy else 0, flat_logprobs=request.want_entropy,
        )  # fmt: skip
        return await self._final(list(request.context_token_ids) + list(tokens), params)

    async def score_if_separate(self, request: ProposalRequest, tokens: Sequence[int]):
        """The scoring pass's output where the engine scores separately; None where the sampler
        returned log p0 with the tokens."""
        return await self.score(request, tokens) if self.scores_separately else None

    @staticmethod
    def scored_tokens(score) -> int:
        """Tokens the scoring pass prefilled (0 without one)."""
        return len(score.prompt_token_ids) if score is not None else 0

    async def _generate(self, requests: list[ProposalRequest]) -> EngineOutput:
        start = time.perf_counter()
        for request in requests:
            self.validate(request)
        live = [i for i, r in enumerate(requests) if r.max_new_tokens > 0]
        sampled = await asyncio.gather(
            *[self._final(list(requests[i].context_token_ids), self.sampling_params(requests[i])) for i in live]
        )
        scoring_start = time.perf_counter()
        scored = await asyncio.gather(*[self.score_if_separate(requests[i], out.outputs[0].token_ids) for i, out in zip(live, sampled)])
        accounting = CallAccounting(calls=1, num_requests=len(requests), scoring_time_s=time.perf_counter() - scoring_start)
        completions = [Completion((), np.zeros(0), np.zeros(0), "length") for _ in requests]
        for i, out, score in zip(live, sampled, scored):
            sample = out.outputs[0]
            tokens = tuple(int(t) for t in sample.token_ids)
            completions[i] = self.completion(requests[i], tokens, self.token_columns(sample.logprobs, tokens), score, int(out.num_cached_tokens or 0))
            accounting.prompt_tokens += len(requests[i].context_token_ids)
            accounting.cached_prompt_tokens += completions[i].cached_prompt_tokens
            accounting.generated_tokens += len(tokens)
            accounting.scoring_tokens += self.scored_tokens(score)
        accounting.wall_time_s = time.perf_counter() - start
        return EngineOutput(completions, accounting)

    def token_columns(self, logprobs, tokens: Sequence[int]) -> np.ndarray:
        """(len(tokens), k) log-probabilities of sampled tokens from one output: log q_tau alone
        (k = 1) with a scoring pass; log q_tau, log p0 and the entropy from the wrapped sampler."""
        if self.scores_separately:
            return np.array([[entry[t].logprob] for entry, t in zip(logprobs, tokens)], dtype=np.float64).reshape(-1, 1)
        return sampler_columns(logprobs, tokens)

    def completion(self, request: ProposalRequest, tokens: tuple[int, ...], columns: np.ndarray, score, cached: int) -> Completion:
        """A proposal's Completion from its sampled tokens, their log-probability columns
        (`token_columns`) and, with a scoring pass, its score."""
        ended = bool(tokens) and request.stop_at_eos and tokens[-1] == self.eos_token_id
        finish = "stop" if ended else "length"
        logq = columns[:, LOGQ_COLUMN].copy()
        if score is None:
            entropy = columns[:, ENTROPY_COLUMN].copy() if request.want_entropy else None
            return Completion(tokens, columns[:, LOGP0_COLUMN].copy(), logq, finish, cached, entropy)
        offset = len(request.context_token_ids)
        scores = score.prompt_logprobs
        logp0 = np.array([scores[offset + i][t].logprob for i, t in enumerate(tokens)], dtype=np.float64)
        entropy = _entropies(scores, offset, len(tokens)) if request.want_entropy else None
        return Completion(tokens, logp0, logq, finish, cached, entropy)

    def streaming(self) -> "VLLMStreamingEngine":
        """This engine's per-request form: completion events, partial tokens, abort, priority."""
        from presto_ray.engines.vllm_streaming import VLLMStreamingEngine

        return VLLMStreamingEngine(self)

    def submit_coroutine(self, coro) -> Future:
        """Run `coro` on the engine's event loop (the streaming form's requests live there)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def call_soon(self, callback) -> None:
        self._loop.call_soon_threadsafe(callback)

    async def abort_request(self, request_id: str) -> None:
        await self._llm.abort(request_id)

    def stream(self, token_ids: list[int], params, request_id: str, priority: int = 0):
        """vLLM's output stream for one request (DELTA outputs when `params` asks for them)."""
        from vllm.inputs import TokensPrompt

        return self._llm.generate(TokensPrompt(prompt_token_ids=token_ids), params, request_id=request_id, priority=priority)

    # --- lifecycle -------------------------------------------------------------------------
    def shutdown(self) -> None:
        if getattr(self, "_llm", None) is not None:
            # AsyncLLM.shutdown stops the engine core first and cancels its output handler last:
            # in between, the handler reads the dead core's EngineDeadError and logs it with a
            # traceback. Cancelling the handler first (on its own loop) leaves nothing to report.
            if self._loop.is_running():
                self._run(self._stop_output_handler())
            self._llm.shutdown()
            self._llm = None
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    async def _stop_output_handler(self) -> None:
        handler = getattr(self._llm, "output_handler", None)
        if handler is not None and not handler.done():
            handler.cancel()
            await asyncio.gather(handler, return_exceptions=True)

    def __enter__(self) -> "VLLMEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
