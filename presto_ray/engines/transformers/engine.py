"""TransformersEngine: the engine contract (presto_ray/engines/base.py) over a Hugging Face
transformers causal LM on any torch device, with exact log p0 and log q_tau from the pass that
generated each token.

The parts: `model` (the model on its device, with the packed attention of `forward`), `runner`
(the continuous batcher: slots, admission, the step, stops; `kv` its slots and prefix cache,
`sampling` and `noise` the keyed draws) and the two forms over it: `generate` here (rounds, the
serial chain: one runner stepped until the call's requests end) and `streaming()` (streaming.py:
per-request streams). Every form shares the model and the prefix cache.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from typing import Any, Sequence

import torch

from presto_ray.engines.base import CallAccounting, Completion, EngineOutput, ProposalRequest, Tokenizer
from presto_ray.engines.transformers.settings import TransformersEngineConfigBase
from presto_ray.engines.transformers.kv import PrefixCache
from presto_ray.engines.transformers.model import LoadedModel, load_model
from presto_ray.engines.transformers.runner import BatchRunner
from presto_ray.engines.transformers.streaming import TransformersStreamingEngine
from presto_ray.engines.transformers.tokenizer import load_tokenizer


class TransformersEngine:
    """A transformers causal LM decoded by presto-ray's continuous batcher (runner.py)."""

    def __init__(
        self,
        config: TransformersEngineConfigBase | None = None,
        *,
        model: LoadedModel | None = None,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        """`model` and `tokenizer`, both or neither: a model already built (model.describe_model)
        and a tokenizer for it, used instead of loading `config.model`'s folder (scripts/gpu_check.py's
        randomly initialised model, prompts as token ids); the config's device, dtype and
        num_threads then say nothing."""
        if (model is None) != (tokenizer is None):
            raise ValueError("pass both model and tokenizer, or neither")
        self.config = config = config or TransformersEngineConfigBase()
        self.tokenizer: Tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config)
        self.eos_token_id: int | None = self.tokenizer.eos_token_id
        self.model_name = config.model_name if model is None else model.model_dir.name
        self.context_length = config.context_length
        self.loaded: LoadedModel | None = model if model is not None else load_model(config)
        self.device = self.loaded.device
        self.model_dir = str(self.loaded.model_dir)
        self.startup_time_s = self.loaded.load_time_s
        self.batch_invariant = config.batch_invariant if config.batch_invariant is not None else self.device.type == "cpu"
        self.prefix_cache = PrefixCache(config.prefix_cache_tokens)
        self._call_lock = threading.Lock()  # one batch call at a time (they share one runner)
        self._runner: BatchRunner | None = self._new_runner()

    def _new_runner(self, max_batch_size: int | None = None) -> BatchRunner:
        if self.loaded is None:
            raise RuntimeError("the transformers engine was shut down")
        c = self.config
        return BatchRunner(
            self.loaded,
            self.prefix_cache,
            eos_token_id=self.eos_token_id,
            max_model_len=c.max_model_len,
            max_batch_size=max_batch_size or c.max_batch_size,
            max_step_tokens=c.max_step_tokens,
            invariant=self.batch_invariant,
        )

    # --- the engine contract -----------------------------------------------------------------
    @property
    def free_batch(self) -> float:
        """The config's, within the batch runner's slots (a round's requests past them wait)."""
        return float(min(self.config.free_batch, self.config.max_batch_size))

    def generate(self, requests: Sequence[ProposalRequest]) -> EngineOutput:
        """Every request on the continuous batcher, up to max_batch_size at once; returns when all
        have ended (each ends on its own: EOS, max tokens, or an early-rejection stop)."""
        start = time.perf_counter()
        with self._call_lock:
            runner = self._batch_runner()
            for request in requests:
                runner.validate(request)
            before = runner.accounting()
            handles = [runner.submit(request) for request in requests]
            done: dict[int, Completion] = {}
            while len(done) < len(handles):
                events = runner.step()
                for event in events:
                    if event.error is not None:
                        self._runner = self._new_runner()  # drop the failed call's requests
                        raise event.error
                    if event.completion is not None:
                        done[event.handle] = event.completion
                if not events and not runner.busy:
                    raise RuntimeError("the transformers engine went idle before the call's requests ended")
            accounting = runner.accounting().minus(before)
        accounting.calls = 1
        accounting.wall_time_s = time.perf_counter() - start
        return EngineOutput([done[h] for h in handles], accounting)

    async def agenerate(self, requests: Sequence[ProposalRequest]) -> EngineOutput:
        """The same call in a worker thread, so an actor's event loop stays free for probes."""
        return await asyncio.to_thread(self.generate, requests)

    def streaming(self, *, max_batch_size: int | None = None) -> TransformersStreamingEngine:
        """A per-request form (its own slots, the shared model and prefix cache): completion
        events, fork points, partial tokens, abort, priority, early-rejection bounds;
        `max_batch_size` overrides the config's for this form (its free batch stays within it)."""
        runner = self._new_runner(max_batch_size)
        free_batch = min(self.config.free_batch, runner.max_batch_size)
        return TransformersStreamingEngine(runner, free_batch=float(free_batch))

    def validate(self, request: ProposalRequest) -> None:
        """Raise ValueError for a request the engine cannot serve."""
        self._batch_runner().validate(request)

    def accounting_totals(self) -> CallAccounting:
        """The batch path's running totals since the engine started."""
        return self._batch_runner().accounting()

    def _batch_runner(self) -> BatchRunner:
        if self._runner is None:
            raise RuntimeError("the transformers engine was shut down")
        return self._runner

    # --- lifecycle -----------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Free the model and the caches (idempotent)."""
        if self.loaded is None:
            return
        device = self.loaded.device
        self.loaded, self._runner = None, None
        self.prefix_cache.clear()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()

    def __enter__(self) -> TransformersEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
