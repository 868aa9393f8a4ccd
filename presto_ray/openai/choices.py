"""One chain's answer before it takes an API's shape: its text, finish reason, figures and (when
asked) each returned token's log p0, and the request's usage over its choices. Both renderers
(completions.py, chat.py) build their bodies from these."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from presto_ray.engines.base import FinishReason, Tokenizer
from presto_ray.openai.figures import choice_figures, usage_figures
from presto_ray.openai.protocol import PowerSamplingStats, Usage
from presto_ray.results import SampleResult, SampleStats


@dataclass(frozen=True)
class TokenLogprob:
    """One returned token: its text alone and its log p0 under the base model, as the chain scored it."""

    token: str
    logprob: float


@dataclass(frozen=True)
class SampledChoice:
    """One chain's answer, before it takes the shape of a completion, a chat choice or a chunk."""

    index: int
    text: str
    finish_reason: FinishReason
    completion_tokens: int
    power_sampling: PowerSamplingStats
    stats: SampleStats  # the chain's whole cost, summed into usage.power_sampling
    logprobs: tuple[TokenLogprob, ...] | None = None  # asked for: every returned token, EOS included


def choice_from_result(
    index: int, result: SampleResult, seed: int, tokenizer: Tokenizer, logprobs: bool = False
) -> SampledChoice:
    """Choice `index` from its chain's result; `seed`: that chain's own seed; `logprobs`: the
    request asked for each returned token's log p0 (the chain's own, not recomputed)."""
    tokens = result.token_ids
    ended = bool(tokens) and tokens[-1] == tokenizer.eos_token_id
    token_logprobs = None
    if logprobs:
        if len(result.logp0) != len(tokens):  # a chain always scores its state; never send made-up values
            raise RuntimeError(f"the chain returned {len(tokens)} tokens but {len(result.logp0)} log p0 values")
        token_logprobs = tuple(TokenLogprob(tokenizer.decode([t]), lp) for t, lp in zip(tokens, result.logp0))
    return SampledChoice(
        index=index,
        text=tokenizer.decode(tokens),
        finish_reason="stop" if ended else "length",
        completion_tokens=len(tokens),
        power_sampling=choice_figures(result.stats, seed),
        stats=result.stats,
        logprobs=token_logprobs,
    )


def request_usage(prompt_tokens: int, choices: Sequence[SampledChoice]) -> Usage:
    """OpenAI's counts (the prompt once, every choice's returned tokens) and the chains' real cost."""
    completion_tokens = sum(c.completion_tokens for c in choices)
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        power_sampling=usage_figures(c.stats for c in choices),
    )
