"""The completions API's shapes (POST /v1/completions): a `text_completion` body and its chunks,
and OpenAI's completions logprobs (tokens, token_logprobs, top_logprobs, text_offset)."""

from __future__ import annotations

from collections.abc import Sequence

from presto_ray.openai.choices import SampledChoice, request_usage
from presto_ray.openai.prepare import Prepared
from presto_ray.openai.protocol import (
    ChunkEvent,
    CompletionChoice,
    CompletionChunk,
    CompletionChunkChoice,
    CompletionLogprobs,
    CompletionResponse,
    DoneEvent,
    ProgressEvent,
    RequestSeed,
    Usage,
    UsageEvent,
)


class CompletionsRenderer:
    """Every body the completions API sends (render.py picks it for a completions request)."""

    response_model = CompletionResponse
    chunk_model = CompletionChunk

    def response(self, prepared: Prepared, choices: Sequence[SampledChoice]) -> CompletionResponse:
        return CompletionResponse(
            id=prepared.id,
            model=prepared.model,
            choices=[
                CompletionChoice(
                    index=c.index,
                    text=c.text,
                    finish_reason=c.finish_reason,
                    power_sampling=c.power_sampling,
                    logprobs=completion_logprobs(c),
                )
                for c in choices
            ],
            usage=request_usage(len(prepared.prompt_ids), choices),
            power_sampling=RequestSeed(seed=prepared.seed),
        )

    def progress_chunk(self, prepared: Prepared, index: int, event: ProgressEvent) -> CompletionChunk:
        return self._chunk(prepared, [CompletionChunkChoice(index=index, text="", finish_reason=None)], event)

    def done_chunk(self, prepared: Prepared, choice: SampledChoice, event: DoneEvent) -> CompletionChunk:
        item = CompletionChunkChoice(
            index=choice.index, text=choice.text, finish_reason=choice.finish_reason, logprobs=completion_logprobs(choice)
        )
        return self._chunk(prepared, [item], event)

    def usage_chunk(self, prepared: Prepared, event: UsageEvent, usage: Usage) -> CompletionChunk:
        return CompletionChunk(id=prepared.id, model=prepared.model, choices=[], power_sampling=event, usage=usage)

    def _chunk(self, prepared: Prepared, choices: list[CompletionChunkChoice], event: ChunkEvent) -> CompletionChunk:
        return CompletionChunk(id=prepared.id, model=prepared.model, choices=choices, power_sampling=event)


def completion_logprobs(choice: SampledChoice) -> CompletionLogprobs | None:
    """With `logprobs: 0`: each returned token, its log p0 and where it starts in the text."""
    if choice.logprobs is None:
        return None
    offsets, at = [], 0
    for t in choice.logprobs:
        offsets.append(at)
        at += len(t.token)
    return CompletionLogprobs(
        tokens=[t.token for t in choice.logprobs],
        token_logprobs=[t.logprob for t in choice.logprobs],
        top_logprobs=[{t.token: t.logprob} for t in choice.logprobs],
        text_offset=offsets,
    )
