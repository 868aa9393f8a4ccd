"""The chat API's shapes (POST /v1/chat/completions): a `chat.completion` body with assistant
messages, its chunks (deltas), and OpenAI's chat logprobs (content, no top alternatives)."""

from __future__ import annotations

from collections.abc import Sequence

from presto_ray.openai.choices import SampledChoice, request_usage
from presto_ray.openai.prepare import Prepared
from presto_ray.openai.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    ChatMessageOut,
    ChatTokenLogprob,
    ChunkEvent,
    DoneEvent,
    ProgressEvent,
    RequestSeed,
    Usage,
    UsageEvent,
)


class ChatRenderer:
    """Every body the chat API sends (render.py picks it for a chat request)."""

    response_model = ChatCompletionResponse
    chunk_model = ChatCompletionChunk

    def response(self, prepared: Prepared, choices: Sequence[SampledChoice]) -> ChatCompletionResponse:
        return ChatCompletionResponse(
            id=prepared.id,
            model=prepared.model,
            choices=[
                ChatChoice(
                    index=c.index,
                    message=ChatMessageOut(content=c.text),
                    finish_reason=c.finish_reason,
                    power_sampling=c.power_sampling,
                    logprobs=chat_logprobs(c),
                )
                for c in choices
            ],
            usage=request_usage(len(prepared.prompt_ids), choices),
            power_sampling=RequestSeed(seed=prepared.seed),
        )

    def progress_chunk(self, prepared: Prepared, index: int, event: ProgressEvent) -> ChatCompletionChunk:
        # a delta that adds nothing is {}, as OpenAI sends it
        return self._chunk(prepared, [ChatChunkChoice(index=index, delta=ChatDelta(), finish_reason=None)], event)

    def done_chunk(self, prepared: Prepared, choice: SampledChoice, event: DoneEvent) -> ChatCompletionChunk:
        delta = ChatDelta(role="assistant", content=choice.text)
        item = ChatChunkChoice(index=choice.index, delta=delta, finish_reason=choice.finish_reason, logprobs=chat_logprobs(choice))
        return self._chunk(prepared, [item], event)

    def usage_chunk(self, prepared: Prepared, event: UsageEvent, usage: Usage) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=prepared.id, model=prepared.model, choices=[], power_sampling=event, usage=usage)

    def _chunk(self, prepared: Prepared, choices: list[ChatChunkChoice], event: ChunkEvent) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=prepared.id, model=prepared.model, choices=choices, power_sampling=event)


def chat_logprobs(choice: SampledChoice) -> ChatLogprobs | None:
    """With `logprobs: true`: each returned token, its log p0 and its UTF-8 bytes."""
    if choice.logprobs is None:
        return None
    content = [ChatTokenLogprob(token=t.token, logprob=t.logprob, bytes=list(t.token.encode())) for t in choice.logprobs]
    return ChatLogprobs(content=content)
