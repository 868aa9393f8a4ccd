"""The continuous batcher: requests wait, take a slot, decode one token per step together with the
other running ones, and end on their own (EOS, max tokens, an early-rejection stop), freeing their
slot for the next waiting request. Both engine forms run on it: the batch call (engine.py) submits
its requests and steps until all end; the streaming form (streaming.py) steps until something
happens.

One step: waiting requests are admitted in priority order (lower first, then first come) while
slots are free and the step's prefill budget lasts, each starting from the longest prefix of its
context whose KV exists (the prefix cache, or a running sequence: a fork reuses its parent's
KV); then one packed forward (forward.py) feeds every running sequence's new tokens, and each
draws its next token from its last logits with its keyed noise (sampling.py, noise.py).

A request is a function of itself alone: its token at position p uses the noise keyed by
(seed, p), its logits come from its own tokens (batch-invariant forward: bit for bit, else up to
rounding), so which requests share a step, and when it was admitted, change nothing.

Not thread-safe: the streaming form serialises calls; `LoadedModel.lock` serialises forwards of
several runners on one model.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from presto_ray.early_rejection import RejectionBound, RequestStop
from presto_ray.engines.base import CallAccounting, Completion, EngineEvent, FinishReason, ProposalRequest
from presto_ray.engines.transformers.forward import PackedStep, Segment, forward_logits
from presto_ray.engines.transformers.kv import PrefixCache, SlotKV, common_prefix_length
from presto_ray.engines.transformers.model import LoadedModel
from presto_ray.engines.transformers.noise import keyed_exponentials
from presto_ray.engines.transformers.sampling import sample_rows

# A waiting request that would share this many more tokens with one being prefilled in the same
# step than the cache gives it waits one step, to copy them instead of computing them again.
DEFER_FOR_SHARED_TOKENS = 16


@dataclass
class RunnerStats:
    steps: int = 0  # forward passes
    generated_tokens: int = 0  # decoded, aborted and early-stopped requests' tokens included
    forward_tokens: int = 0  # tokens fed to the model (prefill and decode, padding excluded)
    aborted_requests: int = 0
    wasted_tokens: int = 0  # decoded by requests aborted before they ended
    early_stopped_requests: int = 0  # ended by exact early rejection
    max_running: int = 0


@dataclass
class _Live:
    handle: int
    request: ProposalRequest
    priority: float
    order: int
    context: tuple[int, ...]
    stop: RequestStop
    tokens: list[int] = field(default_factory=list)
    logp0: list[float] = field(default_factory=list)
    logq: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    wakes: set[int] = field(default_factory=set)
    slot: int | None = None
    computed: int = 0  # positions of context + tokens whose KV is in the slot
    cached: int = 0  # context tokens copied from the prefix cache or a running sequence
    done: bool = False  # ended; its event waits to be collected

    def sequence(self) -> tuple[int, ...]:
        return self.context + tuple(self.tokens)

    def completion(self, finish: FinishReason) -> Completion:
        entropy = np.array(self.entropy, dtype=np.float64) if self.request.want_entropy else None
        return Completion(
            tuple(self.tokens),
            np.array(self.logp0, dtype=np.float64),
            np.array(self.logq, dtype=np.float64),
            finish,
            self.cached,
            entropy,
        )


class BatchRunner:
    """Requests in, events out (EngineEvent: completions, and fork points reached)."""

    def __init__(
        self,
        loaded: LoadedModel,
        cache: PrefixCache,
        *,
        eos_token_id: int | None,
        max_model_len: int,
        max_batch_size: int,
        max_step_tokens: int,
        invariant: bool,
    ) -> None:
        self.loaded = loaded
        self.cache = cache
        self.eos_token_id = eos_token_id
        self.max_model_len = max_model_len
        self.max_batch_size = max_batch_size
        self.max_step_tokens = max_step_tokens
        self.invariant = invariant
        self.kv = SlotKV(loaded.kv_shape, dtype=loaded.dtype, device=loaded.device, max_slots=max_batch_size)
        self.stats = RunnerStats()
        self._accounting = CallAccounting()
        self._handles = itertools.count()
        self._orders = itertools.count()
        self._live: dict[int, _Live] = {}  # waiting, running, or ended with its event not collected
        self._waiting: list[tuple[float, int, int]] = []  # heap of (priority, order, handle)
        self._running: dict[int, _Live] = {}  # by slot
        self._free_slots = list(range(max_batch_size))
        self._events: list[EngineEvent] = []

    # --- requests ------------------------------------------------------------------------------
    def validate(self, request: ProposalRequest) -> None:
        context = len(request.context_token_ids)
        if context == 0:
            raise ValueError("a request needs at least one prompt or prefix token")
        if context + request.max_new_tokens > self.max_model_len:
            raise ValueError(
                f"prompt + prefix ({context}) + max_new_tokens ({request.max_new_tokens}) exceeds the context of "
                f"{self.max_model_len} tokens"
            )
        if request.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {request.temperature}")

    def submit(self, request: ProposalRequest, priority: float = 0.0) -> int:
        self.validate(request)
        handle = next(self._handles)
        live = _Live(handle, request, priority, next(self._orders), request.context_token_ids, RequestStop(request.rejection_bounds))
        self._live[handle] = live
        self._accounting.num_requests += 1
        self._accounting.prompt_tokens += len(live.context)
        if request.max_new_tokens == 0:
            self._end(live, "length")
        else:
            heapq.heappush(self._waiting, (priority, live.order, handle))
        return handle

    def wake_at(self, handle: int, generated: int) -> None:
        live = self._live.get(handle)
        if live is None or live.done:
            return
        if len(live.tokens) >= generated:
            self._events.append(EngineEvent(handle, len(live.tokens)))
        else:
            live.wakes.add(generated)

    def partial_tokens(self, handle: int) -> tuple[int, ...]:
        live = self._live.get(handle)
        return tuple(live.tokens) if live is not None else ()

    def abort(self, handle: int) -> None:
        live = self._live.pop(handle, None)
        if live is None or live.done:
            return
        self.stats.aborted_requests += 1
        self.stats.wasted_tokens += len(live.tokens)
        if live.slot is not None:
            self._release(live)
        # a waiting request's heap entry is skipped when it comes up (its handle is gone)

    def set_rejection_bounds(self, handle: int, bounds: Sequence[RejectionBound]) -> None:
        """New bounds replay the tokens the request has; where they reject them it ends now, with
        all of them (never fewer than it has shown), as "rejected"."""
        live = self._live.get(handle)
        if live is None or live.done:
            return
        live.stop = RequestStop(bounds)
        if not live.tokens:
            return
        entropy = np.array(live.entropy) if live.request.want_entropy else None
        if live.stop.stop_length(np.array(live.logp0), np.array(live.logq), entropy) is not None:
            self.stats.early_stopped_requests += 1
            self._end(live, "rejected")

    @property
    def busy(self) -> bool:
        """Requests waiting, running, or ended with their events not collected."""
        return bool(self._live)

    @property
    def running(self) -> int:
        return len(self._running)

    def accounting(self) -> CallAccounting:
        """Running totals: requests submitted, their context and cached tokens, tokens decoded."""
        a = self._accounting
        return CallAccounting(
            num_requests=a.num_requests,
            prompt_tokens=a.prompt_tokens,
            cached_prompt_tokens=a.cached_prompt_tokens,
            generated_tokens=self.stats.generated_tokens,
        )

    # --- stepping ------------------------------------------------------------------------------
    def step(self) -> list[EngineEvent]:
        """The events ready, or else one forward pass and the events it brought (an empty list: no
        request is waiting or running). Events of aborted requests are dropped; an ended request
        is forgotten once its event is returned."""
        if not self._events:
            self._admit()
            if self._running:
                self._decode()
        events, self._events = self._events, []
        delivered = []
        for event in events:
            live = self._live.get(event.handle)
            if live is None:
                continue  # aborted after the event was raised
            if event.ended:
                del self._live[event.handle]
            delivered.append(event)
        return delivered

    def _admit(self) -> None:
        budget = self.max_step_tokens
        admitted: list[_Live] = []
        while self._waiting and self._free_slots:
            _, _, handle = self._waiting[0]
            live = self._live.get(handle)
            if live is None or live.done:
                heapq.heappop(self._waiting)
                continue
            source, length = self._prefix_source(live.context)
            limit = len(live.context) - 1
            shared = max((common_prefix_length(o.context, live.context, limit) for o in admitted), default=0)
            if shared >= length + DEFER_FOR_SHARED_TOKENS:
                break  # next step: copy what this step computes
            new_tokens = len(live.context) - length
            if admitted and new_tokens > budget:
                break
            heapq.heappop(self._waiting)
            budget -= new_tokens
            slot = heapq.heappop(self._free_slots)
            self.kv.ensure(slot + 1, len(live.context) + live.request.max_new_tokens)
            if isinstance(source, torch.Tensor):
                self.kv.copy_in(slot, source, length)
            elif isinstance(source, int):
                self.kv.copy_slot(source, slot, length)
            live.slot, live.computed, live.cached = slot, length, length
            self._accounting.cached_prompt_tokens += length
            self._running[slot] = live
            admitted.append(live)
        self.stats.max_running = max(self.stats.max_running, len(self._running))

    def _prefix_source(self, context: tuple[int, ...]) -> tuple[torch.Tensor | int | None, int]:
        """Where the longest reusable prefix of `context` is (a cache entry's KV, or a running
        sequence's slot) and its length; always leaves the last context token to feed (its logits
        give the first new token)."""
        limit = len(context) - 1
        kv, best = self.cache.lookup(context, limit)
        source: torch.Tensor | int | None = kv
        for slot, other in self._running.items():
            if other.computed > best:
                length = common_prefix_length(other.sequence()[: other.computed], context, limit)
                if length > best:
                    source, best = slot, length
        return source, best

    def _decode(self) -> None:
        rows = [self._running[slot] for slot in sorted(self._running)]
        segments = []
        for live in rows:
            assert live.slot is not None
            segments.append(Segment(live.slot, live.computed, live.sequence()[live.computed :]))
        step = PackedStep(self.kv, segments, invariant=self.invariant)
        try:
            with self.loaded.lock:
                logits = forward_logits(self.loaded.model, step)
            requests = [live.request for live in rows]
            positions = [s.end for s in segments]
            noise = keyed_exponentials([r.seed for r in requests], positions, logits.shape[-1])
            drawn = sample_rows(logits, [r.temperature for r in requests], noise, any(r.want_entropy for r in requests))
        except Exception as error:  # the device failed the step: every request in it ends with the error
            for live in rows:
                self._release(live, keep=False)  # its KV may be half written
                live.done = True
                self._events.append(EngineEvent(live.handle, len(live.tokens), error=error))
            return
        self.stats.steps += 1
        self.stats.forward_tokens += step.real_tokens
        self.stats.generated_tokens += len(rows)
        for i, (live, segment) in enumerate(zip(rows, segments)):
            live.computed = segment.end
            entropy = float(drawn.entropy[i]) if drawn.entropy is not None and live.request.want_entropy else None
            self._append(live, int(drawn.tokens[i]), float(drawn.logp0[i]), float(drawn.logq[i]), entropy)

    def _append(self, live: _Live, token: int, logp0: float, logq: float, entropy: float | None) -> None:
        """One new token, and how the request goes on: EOS where it stops there, its last token, an
        early-rejection stop (never on a token that ends it anyway), or a fork point reached."""
        request = live.request
        live.tokens.append(token)
        live.logp0.append(logp0)
        live.logq.append(logq)
        if entropy is not None:
            live.entropy.append(entropy)
        count = len(live.tokens)
        if request.stop_at_eos and token == self.eos_token_id:
            self._end(live, "stop")
        elif count >= request.max_new_tokens:
            self._end(live, "length")
        elif live.stop.push(logp0, logq, entropy):
            self.stats.early_stopped_requests += 1
            self._end(live, "rejected")
        elif count in live.wakes:
            live.wakes = {w for w in live.wakes if w > count}
            self._events.append(EngineEvent(live.handle, count))

    def _end(self, live: _Live, finish: FinishReason) -> None:
        if live.slot is not None:
            self._release(live)
        live.done = True
        self._events.append(EngineEvent(live.handle, len(live.tokens), live.completion(finish)))

    def _release(self, live: _Live, keep: bool = True) -> None:
        """Free the slot, keeping its KV in the prefix cache."""
        slot = live.slot
        if slot is None:
            return
        if keep and self.cache.capacity_tokens and live.computed:
            self.cache.insert(live.sequence()[: live.computed], self.kv.copy_out(slot, live.computed))
        del self._running[slot]
        heapq.heappush(self._free_slots, slot)
        live.slot = None
