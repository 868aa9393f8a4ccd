"""Proposal requests to vLLM requests and vLLM outputs back to Completions: the part of the vLLM
engine that holds no engine, shared by the batch path (engine.py) and the streaming path
(streaming.py), so both read log-probabilities the same way.

Log-probabilities. vLLM returns one kind of log-probability per engine (`logprobs_mode` is
engine-wide). The engine runs in `processed_logprobs` mode, so a proposal's sampled tokens come
back with log q_tau, the law they were drawn from (temperature only: top-k, top-p and min-p are
off). Log p0 comes from one of two places (`VLLMEngineConfig.logp0_from`):

- `sampler` (the default): vLLM's sampler, wrapped in its worker (sampler_patch.py), returns
  log p0 and the entropy of p0 of each sampled token beside log q_tau, in the same pass, as
  `SAMPLER_COLUMNS` flat log-probabilities (sampler_columns.py reads them). Measured on 2 CPU
  cores with SmolLM2: within 1e-5 of the scoring pass, the same tokens.
- `scoring_pass`: a second request prefills prompt + prefix + completion at temperature 1 with
  `prompt_logprobs=0`, which returns log p0 of every completion token. vLLM skips the prefix
  cache for such requests (cached rows carry no log-probabilities), so scoring costs a full
  prefill. A request with `want_entropy` is scored with `prompt_logprobs=-1` (the whole
  vocabulary per position) and the entropy of p0 is summed from it: exact, and expensive.

Seeds. Every request carries its own seed (the chain's step key), so a proposal is a function of
(seed, prompt + prefix) and never depends on which other requests share the batch.

Exact early rejection. `TokenReader` collects one request's tokens from its outputs (DELTA outputs
or the one FINAL output) and runs the request's stop rule (`early_rejection.RequestStop`) on each
token as it arrives, with the very float64 columns the Completion will hold; once every bound the
request carries rejects, it keeps the tokens up to the firing one and says so (`stopped`), and the
runtime aborts the vLLM request (`VLLMRuntime.sample`). With a scoring pass, log p0 exists only
after the proposal ends: the bounds are ignored and the request runs to its natural end.

vLLM is imported only to build `SamplingParams` (`vllm_sampling_params`, the default factory):
everything else reads vLLM's outputs by attribute, so it is tested without vLLM.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np

from presto_ray.early_rejection import RejectionBound, RequestStop
from presto_ray.engines.base import Completion, FinishReason, ProposalRequest
from presto_ray.engines.vllm.sampler_columns import ENTROPY_COLUMN, LOGP0_COLUMN, LOGQ_COLUMN, SAMPLER_COLUMNS, sampler_columns

# vLLM's objects, read by attribute (the library is typed without vLLM's types)
RequestOutput = Any  # vllm.outputs.RequestOutput: prompt_token_ids, outputs, num_cached_tokens, prompt_logprobs
CompletionOutput = Any  # vllm.outputs.CompletionOutput (RequestOutput.outputs[0]): token_ids, logprobs
SamplingParams = Any  # vllm.SamplingParams

OutputKind = Literal["final", "delta"]  # one output when the request ends, or one per decode step
SamplingParamsFactory = Callable[[Mapping[str, Any], OutputKind], SamplingParams]


def vllm_sampling_params(kwargs: Mapping[str, Any], output: OutputKind) -> SamplingParams:
    """vLLM's SamplingParams from the codec's keyword arguments."""
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.sampling_params import RequestOutputKind

    kind = RequestOutputKind.DELTA if output == "delta" else RequestOutputKind.FINAL_ONLY
    return VLLMSamplingParams(**kwargs, output_kind=kind)


class VLLMCodec:
    """Requests -> token prompts and SamplingParams; vLLM outputs -> Completions.

    `scores_separately`: log p0 comes from a scoring pass (`logp0_from: scoring_pass`), not from the
    wrapped sampler's columns.
    """

    def __init__(
        self,
        *,
        eos_token_id: int | None,
        max_model_len: int,
        context_length: int,
        scores_separately: bool,
        params_factory: SamplingParamsFactory = vllm_sampling_params,
    ) -> None:
        self.eos_token_id = eos_token_id
        self.max_model_len = max_model_len
        self.context_length = context_length
        self.scores_separately = scores_separately
        self._params = params_factory

    # --- requests -> vLLM -------------------------------------------------------------------
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

    @staticmethod
    def prompt(request: ProposalRequest) -> list[int]:
        """The token prompt vLLM continues: prompt + prefix."""
        return list(request.context_token_ids)

    def sampling_kwargs(self, request: ProposalRequest) -> dict[str, Any]:
        """q_tau exactly (temperature only), the request's own seed, log q_tau of each token (and,
        from the wrapped sampler, log p0 and the entropy: flat, as the sampler's columns)."""
        return dict(
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
        )

    def sampling_params(self, request: ProposalRequest, output: OutputKind = "final") -> SamplingParams:
        return self._params(self.sampling_kwargs(request), output)

    @staticmethod
    def scoring_prompt(request: ProposalRequest, tokens: Sequence[int]) -> list[int]:
        """The scoring pass prefills the request's context followed by its completion."""
        return list(request.context_token_ids) + list(tokens)

    @staticmethod
    def scoring_kwargs(request: ProposalRequest) -> dict[str, Any]:
        """Log p0 of every prompt token (the whole vocabulary per position when entropies are wanted)."""
        want_entropy = request.want_entropy
        return dict(temperature=1.0, max_tokens=1, detokenize=False, prompt_logprobs=-1 if want_entropy else 0, flat_logprobs=want_entropy)

    def scoring_params(self, request: ProposalRequest) -> SamplingParams:
        return self._params(self.scoring_kwargs(request), "final")

    # --- vLLM -> completions ------------------------------------------------------------------
    def token_columns(self, logprobs: Any, tokens: Sequence[int]) -> np.ndarray:
        """(len(tokens), k) log-probabilities of sampled tokens from one output (or one DELTA):
        log q_tau alone (k = 1) with a scoring pass; log q_tau, log p0 and the entropy from the
        wrapped sampler."""
        if self.scores_separately:
            return np.array([[entry[t].logprob] for entry, t in zip(logprobs, tokens)], dtype=np.float64).reshape(-1, 1)
        return sampler_columns(logprobs, tokens)

    def completion(
        self,
        request: ProposalRequest,
        tokens: tuple[int, ...],
        columns: np.ndarray,
        score: RequestOutput | None,
        cached: int,
        stopped: bool = False,
    ) -> Completion:
        """A proposal's Completion from its sampled tokens, their log-probability columns
        (`token_columns`) and, with a scoring pass, its output; `stopped`: ended by early
        rejection (finish reason "rejected")."""
        ended = bool(tokens) and request.stop_at_eos and tokens[-1] == self.eos_token_id
        finish: FinishReason = "rejected" if stopped else "stop" if ended else "length"
        logq = columns[:, LOGQ_COLUMN].copy()
        if score is None:
            entropy = columns[:, ENTROPY_COLUMN].copy() if request.want_entropy else None
            return Completion(tokens, columns[:, LOGP0_COLUMN].copy(), logq, finish, cached, entropy)
        offset = len(request.context_token_ids)
        scores = score.prompt_logprobs
        logp0 = np.array([scores[offset + i][t].logprob for i, t in enumerate(tokens)], dtype=np.float64)
        entropy = entropies(scores, offset, len(tokens)) if request.want_entropy else None
        return Completion(tokens, logp0, logq, finish, cached, entropy)

    def final_completion(self, request: ProposalRequest, output: RequestOutput, score: RequestOutput | None) -> Completion:
        """The Completion of a request's FINAL output (its bounds, if any, applied to its tokens)."""
        reader = TokenReader(self, request)
        reader.read(output)
        return reader.completion(score)


class TokenReader:
    """One request's sampled tokens and their columns, read from its vLLM outputs as they come
    (each DELTA output, or the one FINAL output), with exact early rejection's stop rule next to
    the tokens.

    Each new token's (log p0, log q_tau, entropy) is pushed into the request's `RequestStop`, read
    from the same float64 columns `completion` puts into the Completion, in the toy engine's
    order: a token that ends the request naturally (EOS where it stops, or the max_new_tokens-th)
    never stops it early. Once every bound rejects, the tokens up to and including the firing one
    are kept, the rest of that output is dropped and `stopped` is set: the caller aborts the vLLM
    request (`VLLMRuntime.sample` does). `decoded` counts every token vLLM sent, dropped ones
    included (what the request cost).

    With a scoring pass (`codec.scores_separately`) log p0 is known only after the proposal ends,
    so the request's bounds are ignored: it never stops early.
    """

    def __init__(self, codec: VLLMCodec, request: ProposalRequest) -> None:
        self.codec = codec
        self.request = request
        self.tokens: list[int] = []
        self._columns: list[np.ndarray] = []
        self.decoded = 0
        self.cached = 0
        self.stopped = False
        self._use_bounds(request.rejection_bounds)

    def _use_bounds(self, bounds: Sequence[RejectionBound]) -> None:
        bounds = () if self.codec.scores_separately else tuple(bounds)
        self.can_stop = bool(bounds)  # worth streaming: the batch path reads FINAL outputs otherwise
        self._stop = RequestStop(bounds)

    @property
    def output_kind(self) -> OutputKind:
        """DELTA outputs where the request may stop early, else the FINAL one alone."""
        return "delta" if self.can_stop else "final"

    def read(self, output: RequestOutput) -> None:
        """Take one output's new tokens (a DELTA's, or a FINAL output's all of them)."""
        self.cached = cached_tokens(output) or self.cached
        sample = output.outputs[0]
        tokens = [int(t) for t in sample.token_ids]
        self.decoded += len(tokens)
        if self.stopped or not tokens:  # an abort's last output carries no tokens
            return
        columns = self.codec.token_columns(sample.logprobs, tokens)
        keep = self._stop_length(tokens, columns, len(self.tokens)) if self.can_stop else None
        if keep is not None:
            tokens, columns, self.stopped = tokens[:keep], columns[:keep], True
        self._columns.append(columns)
        self.tokens.extend(tokens)

    def _stop_length(self, tokens: Sequence[int], columns: np.ndarray, before: int) -> int | None:
        """How many of `tokens` (after `before` tokens already pushed) to keep when the stop fires
        among them (None: it does not)."""
        request, eos = self.request, self.codec.eos_token_id
        for i, token in enumerate(tokens):
            generated = before + i + 1
            if request.stop_at_eos and token == eos:
                return None  # a natural end: vLLM sends nothing after it
            row = columns[i]
            # the entropy as the Completion holds it: none unless the request wants it
            entropy = row[ENTROPY_COLUMN] if request.want_entropy else None
            if self._stop.push(row[LOGP0_COLUMN], row[LOGQ_COLUMN], entropy) and generated < request.max_new_tokens:
                return i + 1
        return None

    def set_bounds(self, bounds: Sequence[RejectionBound]) -> bool:
        """Replace the request's bounds (the streaming form's `set_rejection_bounds`): the new stop
        rule follows the tokens read so far, then every new one. True when it rejects the tokens
        the request has: it stops now with all of them (never fewer than it has shown; a rejection
        certain after m tokens stays certain after more), unless they end it naturally anyway.
        A request already stopped keeps its stop (its abort is under way)."""
        if self.stopped:
            return False
        self._use_bounds(bounds)
        if not self.can_stop or not self.tokens:
            return False
        request, count = self.request, len(self.tokens)
        ended = count >= request.max_new_tokens or (request.stop_at_eos and self.tokens[-1] == self.codec.eos_token_id)
        if ended or self._stop_length(self.tokens, self.columns(), 0) is None:
            return False
        self.stopped = True
        return True

    def columns(self) -> np.ndarray:
        width = 1 if self.codec.scores_separately else SAMPLER_COLUMNS
        return np.concatenate(self._columns) if self._columns else np.zeros((0, width))

    def completion(self, score: RequestOutput | None) -> Completion:
        """The request's Completion (after its scoring pass, with one); a request that generated
        nothing (max_new_tokens 0) is `empty_completion`."""
        if not self.tokens:
            return empty_completion()
        return self.codec.completion(self.request, tuple(self.tokens), self.columns(), score, self.cached, self.stopped)


def empty_completion() -> Completion:
    """A request for no tokens (max_new_tokens 0) never reaches vLLM."""
    return Completion((), np.zeros(0), np.zeros(0), "length")


def cached_tokens(output: RequestOutput) -> int:
    """Prompt tokens the request read from the prefix cache (vLLM reports None before it knows)."""
    return int(output.num_cached_tokens or 0)


def scored_tokens(score: RequestOutput | None) -> int:
    """Tokens a scoring pass prefilled (0 without one)."""
    return len(score.prompt_token_ids) if score is not None else 0


def entropies(flat: Any, offset: int, count: int) -> np.ndarray:
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
