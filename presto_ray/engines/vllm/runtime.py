"""One vLLM AsyncLLM on a private event-loop thread: the only part of the vLLM engine that holds
vLLM's engine. The batch path (engine.py) and the streaming path (streaming.py) both run their
proposals here (`sample`: one request to its end, or to its early stop); what a request and its
outputs mean is codec.py's.

vLLM starts worker processes with `spawn`: create the runtime from a `__main__` guard, a test, or
an actor, never at import time of a script's main module.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from concurrent.futures import Future
from typing import Any, AsyncGenerator, Callable, Coroutine, Sequence, TypeVar

from presto_ray.engines.base import ProposalRequest
from presto_ray.engines.vllm.codec import OutputKind, RequestOutput, SamplingParams, TokenReader, VLLMCodec
from presto_ray.engines.vllm.settings import VLLMEngineConfigBase
from presto_ray.engines.vllm.sampler_columns import EXTENSION_QUALNAME, SAMPLER_COLUMNS

T = TypeVar("T")


def set_cpu_environment(config: VLLMEngineConfigBase) -> None:
    """Thread binding for vLLM's CPU worker (read by vLLM when it starts)."""
    if config.cpu_threads_bind is not None:
        bind = f"0-{(os.cpu_count() or 1) - 1}" if config.cpu_threads_bind == "all" else config.cpu_threads_bind
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", bind)
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")


class VLLMRuntime:
    """AsyncLLM for `model_dir` with `config`'s settings, on its own event loop; callers on any
    thread run coroutines there (`run`, `submit`) and stream requests (`stream`, `final`, `abort`)."""

    def __init__(self, config: VLLMEngineConfigBase, model_dir: str) -> None:
        self.config = config
        self.model_dir = model_dir
        self._ids = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine-loop", daemon=True)
        self._thread.start()
        start = time.perf_counter()
        try:
            self.llm: Any = self.run(self._start())
        except BaseException:
            self.llm = None
            self.shutdown()  # the loop thread would outlive a failed start
            raise
        self.startup_time_s = time.perf_counter() - start

    async def _start(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        c = self.config
        args = AsyncEngineArgs(
            model=self.model_dir,
            dtype=c.dtype,
            enforce_eager=c.enforce_eager,
            block_size=c.kv_block_size,
            gpu_memory_utilization=c.gpu_memory_utilization,
            kv_cache_memory_bytes=None if c.kv_cache_gib is None else int(c.kv_cache_gib * 2**30),
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

    # --- running coroutines on the loop --------------------------------------------------------
    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the loop and wait for its result (from any thread but the loop's)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Start `coro` on the loop; its future."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        """`run`, awaitable from another event loop (Ray actors)."""
        return await asyncio.wrap_future(self.submit(coro))

    # --- requests (on the loop) ------------------------------------------------------------------
    def stream(
        self, token_ids: list[int], params: SamplingParams, request_id: str, priority: int = 0
    ) -> AsyncGenerator[RequestOutput, None]:
        """vLLM's output stream for one request (DELTA outputs when `params` asks for them)."""
        from vllm.inputs import TokensPrompt

        outputs: AsyncGenerator[RequestOutput, None] = self.llm.generate(
            TokensPrompt(prompt_token_ids=token_ids), params, request_id=request_id, priority=priority
        )
        return outputs

    async def sample(
        self,
        reader: TokenReader,
        request_id: str | None = None,
        priority: int = 0,
        *,
        output: OutputKind | None = None,
        read: Callable[[RequestOutput], None] | None = None,
    ) -> TokenReader:
        """Run `reader`'s proposal request, each output read by `read` (default `reader.read`; the
        streaming path reads under its lock and raises fork events), until vLLM ends it or the
        reader's early-rejection stop fires: then the vLLM request is aborted at once (its slot
        and KV blocks freed) and the stream closed. `output`: the outputs' kind, by default DELTA
        where the request can stop early and FINAL_ONLY otherwise (`reader.output_kind`)."""
        request_id = request_id if request_id is not None else f"presto-{next(self._ids)}"
        params = reader.codec.sampling_params(reader.request, output or reader.output_kind)
        outputs = self.stream(reader.codec.prompt(reader.request), params, request_id, priority)
        read = read or reader.read
        async for out in outputs:
            read(out)
            if reader.stopped:
                break
        if reader.stopped:
            await self.abort(request_id)  # a no-op when the stop came with vLLM's last output
            await outputs.aclose()
        return reader

    async def final(self, token_ids: list[int], params: SamplingParams) -> RequestOutput:
        """The last output of one request (its only one with FINAL_ONLY params)."""
        final = None
        async for output in self.stream(token_ids, params, f"presto-{next(self._ids)}"):
            final = output
        return final

    async def score(self, codec: VLLMCodec, request: ProposalRequest, tokens: Sequence[int]) -> RequestOutput:
        """The scoring pass: log p0 (and entropies when asked) of `tokens` after the request's context."""
        return await self.final(codec.scoring_prompt(request, tokens), codec.scoring_params(request))

    async def score_if_separate(self, codec: VLLMCodec, request: ProposalRequest, tokens: Sequence[int]) -> RequestOutput | None:
        """The scoring pass's output where the codec scores separately; None where the sampler
        returned log p0 with the tokens."""
        return await self.score(codec, request, tokens) if codec.scores_separately else None

    async def abort(self, request_id: str) -> None:
        await self.llm.abort(request_id)

    # --- lifecycle -------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop AsyncLLM and the loop; idempotent."""
        if self.llm is not None:
            # AsyncLLM.shutdown stops the engine core first and cancels its output handler last:
            # in between, the handler reads the dead core's EngineDeadError and logs it with a
            # traceback. Cancelling the handler first (on its own loop) leaves nothing to report.
            if self._loop.is_running():
                self.run(self._stop_output_handler())
            self.llm.shutdown()
            self.llm = None
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    async def _stop_output_handler(self) -> None:
        handler = getattr(self.llm, "output_handler", None)
        if handler is not None and not handler.done():
            handler.cancel()
            await asyncio.gather(handler, return_exceptions=True)
