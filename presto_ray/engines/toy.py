"""ToyEngine: an exact tiny language model in numpy.

Its next-token logits depend on the whole context (a bigram table plus a row picked by a rolling
hash of every token so far), so probabilities are exact and enumerable. Sampling is Gumbel-max
with noise drawn from a generator seeded by the request's seed, one row per generated position:
the completion is a deterministic function of (seed, context), and exact under q_tau.

A call's requests without rejection bounds decode in lockstep, as a device decodes a batch: one
array operation per token position for all of them (`_complete_together`); a request with bounds
decodes alone (`_complete`), stopping once they reject. Both give the same tokens and floats.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import OrderedDict
from dataclasses import replace
from typing import Sequence

import numpy as np

from presto_ray.engines.base import CallAccounting, Completion, EngineOutput, FinishReason, ProposalRequest
from presto_ray.early_rejection import RequestStop
from presto_ray.engines.toy_tokenizer import ToyTokenizer
from presto_ray.engines.virtual_clock import VirtualClockEngine

__all__ = ["ToyEngine", "ToyTokenizer"]

_HASH_MULT = 1_000_003
_HASH_MOD = (1 << 61) - 1


# Gumbel noise is drawn for this many tokens at once (a call per token cost more than the draws
# a request that stops early leaves unused; its generator is its own, so they change nothing).
_NOISE_ROWS = 16

# At most this many requests decode in one lockstep batch (its logits are kept until its stats).
_LOCKSTEP_REQUESTS = 256


def _log_softmax(z: np.ndarray) -> np.ndarray:
    m = z.max()
    return z - (m + np.log(np.exp(z - m).sum()))


def _token_stats(
    z: np.ndarray, picked: tuple[np.ndarray, list[int]], inv_tau: float | np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """log p0 of each row's picked token, the entropy of p0 per row, and log q_tau of the picked
    token (`inv_tau`: 1 / tau, one for all rows or a column of one per row; None: greedy, log q
    0), for rows of logits `z`. Row by row the float operations of `_log_softmax`: numpy reduces
    each row of a contiguous array as it does a lone row."""
    lp = z - (z.max(axis=1) + np.log(np.exp(z - z.max(axis=1, keepdims=True)).sum(axis=1)))[:, None]
    entropy = -(np.exp(lp) * lp).sum(axis=1)
    if inv_tau is None:
        return lp[picked], entropy, np.zeros(len(z))
    zq = z * inv_tau
    top = zq.max(axis=1)
    return lp[picked], entropy, zq[picked] - (top + np.log(np.exp(zq - top[:, None]).sum(axis=1)))


class ToyEngine:
    """A deterministic context-dependent language model.

    Args:
        vocab_size: number of tokens.
        eos_token_id: the EOS token, or None for a model without EOS.
        seed: seed of the model's tables (not of sampling).
        logit_scale: multiplies every logit; large values (3-6) make distributions peaked like an
            LLM's, so that most MH decisions land near 0 or 1.
        eos_bias: added to the EOS logit before scaling (negative: longer answers).
        context_rows: rows of the context table indexed by the rolling hash.
        max_model_len: the context length the engine reports (the toy itself has no limit).
        cache_block_size: granularity of the simulated prefix cache used for accounting.
        call_latency_s, token_latency_s: a latency model for benchmarks: each call sleeps
            call_latency_s plus token_latency_s per generated token (a GPU's fixed cost per call
            and its decode cost), so batching and coordination overheads can be measured.
    """

    def __init__(
        self,
        vocab_size: int = 32,
        eos_token_id: int | None = 0,
        seed: int = 0,
        *,
        logit_scale: float = 1.0,
        eos_bias: float = 0.0,
        context_rows: int = 4096,
        cache_block_size: int = 16,
        cache_capacity_blocks: int = 200_000,
        max_model_len: int = 4096,
        call_latency_s: float = 0.0,
        token_latency_s: float = 0.0,
        speculation_batch: int | None = None,
    ) -> None:
        if vocab_size < 2:
            raise ValueError("vocab_size must be at least 2")
        if eos_token_id is not None and not 0 <= eos_token_id < vocab_size:
            raise ValueError("eos_token_id must be None or a token id below vocab_size")
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.logit_scale = float(logit_scale)
        self.speculation_batch = speculation_batch
        rng = np.random.default_rng(seed)
        self._bigram = rng.standard_normal((vocab_size + 1, vocab_size))  # last row: empty context
        self._context = rng.standard_normal((context_rows, vocab_size))
        if eos_token_id is not None:
            self._bigram[:, eos_token_id] += eos_bias
        self._cache_block = cache_block_size
        self._cache_capacity = cache_capacity_blocks
        self._cache: OrderedDict[int, None] = OrderedDict()
        self.tokenizer = ToyTokenizer(vocab_size, eos_token_id)
        self.call_latency_s = float(call_latency_s)
        self.token_latency_s = float(token_latency_s)
        self.model_name = "toy"
        self.context_length = int(max_model_len)
        self._call_lock = threading.Lock()

    # --- exact probabilities -------------------------------------------------------------
    @staticmethod
    def _push(h: int, token: int) -> int:
        return (h * _HASH_MULT + token + 1) % _HASH_MOD

    def _logits(self, h: int, last: int | None) -> np.ndarray:
        row = self.vocab_size if last is None else last
        return self.logit_scale * (self._bigram[row] + self._context[h % len(self._context)])

    def _context_hash(self, token_ids: Sequence[int]) -> int:
        h = 0
        for t in token_ids:
            h = self._push(h, int(t))
        return h

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        last = int(token_ids[-1]) if len(token_ids) else None
        return self._logits(self._context_hash(token_ids), last)

    def next_token_logprobs(self, token_ids: Sequence[int]) -> np.ndarray:
        """Exact log p0 over the vocabulary for the token after `token_ids` (prompt + generated)."""
        return _log_softmax(self.logits(token_ids))

    def next_token_entropy(self, token_ids: Sequence[int]) -> float:
        lp = self.next_token_logprobs(token_ids)
        return float(-(np.exp(lp) * lp).sum())

    # --- sampling ------------------------------------------------------------------------
    def _complete(self, request: ProposalRequest, h: int | None = None) -> Completion:
        """The request's completion (`h`: its context's hash, when the caller has it).

        Tokens are drawn one at a time (each needs the last one's logits); their log p0, log q and
        entropy follow a chunk (_NOISE_ROWS tokens) at once, row by row the float operations of
        `_log_softmax` on one token's logits, and on them divided by tau (numpy reduces each row
        of a contiguous array as it does a lone row: the same floats, tests/test_bench_host_time.py).
        The stop rule then runs over the chunk, so a request that stops early decodes at most a
        chunk's tokens past its stop (the toy's own CPU time; the completion is the same)."""
        context = request.context_token_ids
        if h is None:
            h = self._context_hash(context)
        last = context[-1] if context else None
        max_new = request.max_new_tokens
        noise_rng = np.random.default_rng(request.seed)
        greedy = request.temperature == 0.0  # argmax decoding: q puts all its mass on one token
        inv_tau = 0.0 if greedy else 1.0 / request.temperature
        stop = RequestStop(request.rejection_bounds)
        stops = bool(request.rejection_bounds)
        eos = self.eos_token_id if request.stop_at_eos else None
        bigram, table, scale = self._bigram, self._context, self.logit_scale
        rows = len(table)
        empty_row = self.vocab_size
        tokens: list[int] = []
        logp0_parts: list[np.ndarray] = []
        logq_parts: list[np.ndarray] = []
        entropy_parts: list[np.ndarray] = []
        finish: FinishReason = "length"
        logits = np.empty((_NOISE_ROWS, self.vocab_size))
        position = 0
        while position < max_new and finish == "length":
            size = min(_NOISE_ROWS, max_new - position)
            # the same draws as one row per token: a Generator fills them in order
            noise = None if greedy else noise_rng.gumbel(size=(size, self.vocab_size))
            chunk: list[int] = []
            for row in range(size):
                z = scale * (bigram[empty_row if last is None else last] + table[h % rows])
                logits[row] = z
                token = int(z.argmax()) if greedy else int((z * inv_tau + noise[row]).argmax())  # type: ignore[index]
                chunk.append(token)
                h, last = self._push(h, token), token
                if token == eos:
                    finish = "stop"
                    break
            count = len(chunk)
            chunk_logp0, chunk_entropy, chunk_logq = _token_stats(logits[:count], (np.arange(count), chunk), None if greedy else inv_tau)
            if stops:
                # not after an EOS token (the walk never asks beyond it)
                for i in range(count - (finish == "stop")):
                    if stop.push(float(chunk_logp0[i]), float(chunk_logq[i]), float(chunk_entropy[i])) and position + i + 1 < max_new:
                        finish = "rejected"  # every node that would use the rest rejects it already
                        count = i + 1
                        break
            tokens += chunk[:count]
            logp0_parts.append(chunk_logp0[:count])
            logq_parts.append(chunk_logq[:count])
            entropy_parts.append(chunk_entropy[:count])
            position += count
        if not tokens:
            return Completion((), np.zeros(0), np.zeros(0), finish, entropy=np.zeros(0))
        return Completion(
            tuple(tokens), np.concatenate(logp0_parts), np.concatenate(logq_parts), finish, entropy=np.concatenate(entropy_parts)
        )

    def _complete_together(self, requests: Sequence[ProposalRequest], hashes: Sequence[int]) -> list[Completion]:
        """The completions of requests without rejection bounds (`hashes`: their contexts'),
        decoded in lockstep as a device decodes a batch: each step draws the next token of every
        unfinished request in one array operation over the batch's rows, and the statistics of
        every token follow in one operation at the end. The same tokens and floats as `_complete`
        one request at a time: a row of a batched operation is the lone row's operation, each
        request draws its noise from its own generator in the same chunks, and a greedy row (no
        noise, 1 / tau taken as 1) picks the argmax of its logits."""
        vocab, count = self.vocab_size, len(requests)
        bigram, table, scale = self._bigram, self._context, self.logit_scale
        rows = len(table)
        limits = [request.max_new_tokens for request in requests]
        eos = [self.eos_token_id if request.stop_at_eos else None for request in requests]
        greedy = [request.temperature == 0.0 for request in requests]
        generators = [None if g else np.random.default_rng(request.seed) for g, request in zip(greedy, requests)]
        inv_tau = np.array([1.0 if g else 1.0 / request.temperature for g, request in zip(greedy, requests)])
        # the unfinished requests (`active`, by index), each one's row in this step's arrays
        active = [i for i in range(count) if limits[i] > 0]
        lasts = np.array([requests[i].context_token_ids[-1] if requests[i].context_token_ids else vocab for i in active], dtype=np.intp)
        states = [hashes[i] for i in active]
        ends = min((limits[i] for i in active), default=0)  # the first step where a request reaches its limit
        step_logits: list[np.ndarray] = []  # each step's rows of logits, and whose they are
        step_owners: list[list[int]] = []
        step_tokens: list[list[int]] = []
        finishes: list[FinishReason] = ["length"] * count
        noise = np.zeros((0, 0, vocab))
        position = 0
        while active:
            at = position % _NOISE_ROWS
            if at == 0:  # each request's next chunk of noise, as `_complete` draws it
                noise = np.zeros((_NOISE_ROWS, len(active), vocab))
                for row, i in enumerate(active):
                    generator = generators[i]
                    if generator is not None:
                        size = min(_NOISE_ROWS, limits[i] - position)
                        noise[:size, row] = generator.gumbel(size=(size, vocab))
                active_inv_tau = inv_tau[active][:, None]
            z = scale * (bigram[lasts] + table[[state % rows for state in states]])
            choice = (z * active_inv_tau + noise[at]).argmax(axis=1)
            picks = choice.tolist()
            step_logits.append(z)
            step_owners.append(active)
            step_tokens.append(picks)
            states = [(state * _HASH_MULT + token + 1) % _HASH_MOD for state, token in zip(states, picks)]  # `_push`
            lasts = choice
            position += 1
            if position == ends or self.eos_token_id in picks:  # some request may end here
                kept = []
                for row, (i, token) in enumerate(zip(active, picks)):
                    if token == eos[i]:
                        finishes[i] = "stop"
                    elif position < limits[i]:
                        kept.append(row)
                if len(kept) < len(active):
                    active = [active[row] for row in kept]
                    states = [states[row] for row in kept]
                    lasts, noise, active_inv_tau = lasts[kept], noise[:, kept], active_inv_tau[kept]
                    ends = min((limits[i] for i in active), default=0)
        if not step_logits:
            return [Completion((), np.zeros(0), np.zeros(0), "length", entropy=np.zeros(0)) for _ in requests]
        owners = np.array([i for owner in step_owners for i in owner])
        tokens = [token for picks in step_tokens for token in picks]
        logp0, entropy, logq = _token_stats(np.concatenate(step_logits), (np.arange(len(tokens)), tokens), inv_tau[owners][:, None])
        logq[np.array(greedy)[owners]] = 0.0  # argmax decoding: q puts all its mass on one token
        # rows are in step order: each request's, in order, are where a stable sort by owner puts them
        order = np.argsort(owners, kind="stable")
        lengths = np.bincount(owners, minlength=count).tolist()
        logp0, entropy, logq = logp0[order], entropy[order], logq[order]
        ordered_tokens = np.array(tokens)[order].tolist()
        completions, start = [], 0
        for i, n in enumerate(lengths):
            stop = start + n
            completions.append(
                Completion(tuple(ordered_tokens[start:stop]), logp0[start:stop], logq[start:stop], finishes[i], entropy=entropy[start:stop])
            )
            start = stop
        return completions

    @property
    def free_batch(self) -> float:
        """`speculation_batch`, else unlimited: the toy's batch costs nothing."""
        return math.inf if self.speculation_batch is None else float(self.speculation_batch)

    def generate(self, requests: Sequence[ProposalRequest]) -> EngineOutput:
        with self._call_lock:  # like a device serving one batch at a time
            return self._generate(requests)

    async def agenerate(self, requests: Sequence[ProposalRequest]) -> EngineOutput:
        """The same call in a worker thread, so an actor's event loop stays free for probes."""
        return await asyncio.to_thread(self.generate, requests)

    def shutdown(self) -> None:
        """Nothing to free: the toy holds only numpy tables."""

    def streaming(
        self,
        *,
        step_cost: float = 1.0,
        step_cost_per_sequence: float = 0.0,
        max_running: int | None = None,
        seconds_per_time_unit: float | None = None,
    ) -> VirtualClockEngine:
        """This model on a continuous-batching device in virtual time (per-request submission,
        partial tokens, abort, priority), with VirtualClockEngine's cost settings. A decode step
        takes `token_latency_s` of wall time in an engine replica unless `seconds_per_time_unit` is given."""
        return VirtualClockEngine(
            self,
            step_cost=step_cost,
            step_cost_per_sequence=step_cost_per_sequence,
            max_running=max_running,
            seconds_per_time_unit=self.token_latency_s if seconds_per_time_unit is None else seconds_per_time_unit,
            speculation_batch=self.speculation_batch,
        )

    def _generate(self, requests: Sequence[ProposalRequest]) -> EngineOutput:
        start = time.perf_counter()
        accounting = CallAccounting(calls=1, num_requests=len(requests))
        # the context's rolling hash once: its cache blocks, its completion's start, the
        # completion's blocks after it
        contexts = [self._block_hashes(request.context_token_ids) for request in requests]
        decoded: dict[int, Completion] = {}
        together = [i for i, request in enumerate(requests) if not request.rejection_bounds]
        if len(together) > 1:
            for group in range(0, len(together), _LOCKSTEP_REQUESTS):
                indices = together[group : group + _LOCKSTEP_REQUESTS]
                decoded.update(zip(indices, self._complete_together([requests[i] for i in indices], [contexts[i][1] for i in indices])))
        completions = []
        for i, request in enumerate(requests):
            completion = decoded.get(i)
            if completion is None:
                completion = self._complete(request, contexts[i][1])
            blocks, h = contexts[i]
            cached = self._cached_prefix_tokens(blocks)
            completion = replace(completion, cached_prompt_tokens=cached)
            context_length = len(request.context_token_ids)
            accounting.prompt_tokens += context_length
            accounting.cached_prompt_tokens += cached
            accounting.generated_tokens += len(completion.token_ids)
            self._remember(blocks + self._block_hashes(completion.token_ids, h, context_length)[0])
            completions.append(completion)
        delay = self.call_latency_s + self.token_latency_s * accounting.generated_tokens
        if delay > 0:
            time.sleep(delay)
        accounting.wall_time_s = time.perf_counter() - start
        return EngineOutput(completions, accounting)

    # --- a simulated prefix cache (accounting only; results never depend on it) ------------
    def _block_hashes(self, token_ids: Sequence[int], h: int = 0, offset: int = 0) -> tuple[list[int], int]:
        """The rolling hash at each cache block's end within `token_ids`, continuing from hash
        `h` after `offset` tokens; and the hash after them all."""
        hashes = []
        block = self._cache_block
        for i, t in enumerate(token_ids, offset + 1):
            h = (h * _HASH_MULT + int(t) + 1) % _HASH_MOD  # `_push`, inlined: it runs over every context
            if i % block == 0:
                hashes.append(h)
        return hashes, h

    def _cached_prefix_tokens(self, blocks: Sequence[int]) -> int:
        """Tokens of a context whose leading blocks (`blocks`: their hashes) are cached."""
        cached = 0
        for h in blocks:
            if h not in self._cache:
                break
            self._cache.move_to_end(h)
            cached += self._cache_block
        return cached

    def _remember(self, blocks: Sequence[int]) -> None:
        for h in blocks:
            self._cache[h] = None
            self._cache.move_to_end(h)
        while len(self._cache) > self._cache_capacity:
            self._cache.popitem(last=False)
