"""What the service sends for a prepared request: the whole body, or the server-sent events of a
stream (progress per chain round, each choice's text once its chain is over, the usage, [DONE]).
The one place that picks a request's API: its renderer (completions.py or chat.py) gives every
body its shape; the figures are figures.py's, the same for both."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pydantic import BaseModel

from presto_ray.openai.chat import ChatRenderer
from presto_ray.openai.choices import SampledChoice, request_usage
from presto_ray.openai.completions import CompletionsRenderer
from presto_ray.openai.figures import progress_event
from presto_ray.openai.prepare import Prepared
from presto_ray.openai.protocol import (
    ChatCompletionChunk,
    Chunk,
    CompletionChunk,
    DoneEvent,
    ProgressEvent,
    Response,
    Usage,
    UsageEvent,
)
from presto_ray.results import SampleStats


class Renderer(Protocol):
    """One API's bodies; its response and chunk models are its OpenAPI answers too (its request
    model is prepare.py's `request_model`)."""

    @property
    def response_model(self) -> type[Response]: ...

    @property
    def chunk_model(self) -> type[Chunk]: ...

    def response(self, prepared: Prepared, choices: Sequence[SampledChoice]) -> Response: ...

    def progress_chunk(self, prepared: Prepared, index: int, event: ProgressEvent) -> Chunk: ...

    def done_chunk(self, prepared: Prepared, choice: SampledChoice, event: DoneEvent) -> Chunk: ...

    def usage_chunk(self, prepared: Prepared, event: UsageEvent, usage: Usage) -> Chunk: ...


COMPLETIONS: Renderer = CompletionsRenderer()
CHAT: Renderer = ChatRenderer()


def renderer(chat: bool) -> Renderer:
    """The API a request came on (Prepared.chat, or the route's)."""
    return CHAT if chat else COMPLETIONS


def completion_response(prepared: Prepared, choices: Sequence[SampledChoice]) -> Response:
    """The whole answer to a request that did not ask to stream."""
    return renderer(prepared.chat).response(prepared, choices)


def progress_chunk(prepared: Prepared, index: int, stats: SampleStats, events_done: int, events_total: int) -> Chunk:
    """Choice `index`'s chain finished a round; `stats`: the chain's running counts."""
    return renderer(prepared.chat).progress_chunk(prepared, index, progress_event(stats, events_done, events_total))


def done_chunk(prepared: Prepared, choice: SampledChoice) -> Chunk:
    """A choice's whole text, once its chain is over (power samples exist only whole)."""
    event = DoneEvent(**choice.power_sampling.model_dump(), completion_tokens=choice.completion_tokens)
    return renderer(prepared.chat).done_chunk(prepared, choice, event)


def usage_chunk(prepared: Prepared, choices: Sequence[SampledChoice]) -> Chunk:
    """With stream_options.include_usage, the last chunk: no choices, the whole request's usage."""
    usage = request_usage(len(prepared.prompt_ids), choices)
    return renderer(prepared.chat).usage_chunk(prepared, UsageEvent(seed=prepared.seed), usage)


def stream_end(prepared: Prepared, choices: Sequence[SampledChoice]) -> list[str]:
    """The events that close a stream whose chains are all over: the usage chunk when it was
    asked for and every choice is there (a failed chain has no cost to report), then [DONE]."""
    events = []
    if prepared.include_usage and len(choices) == len(prepared.configs):
        events.append(sse_event(prepared, usage_chunk(prepared, sorted(choices, key=lambda c: c.index))))
    return [*events, "data: [DONE]\n\n"]


def sse_event(prepared: Prepared, body: BaseModel) -> str:
    """One server-sent event; chunks carry `usage` (null until the last) only when it was asked for."""
    is_chunk = isinstance(body, (CompletionChunk, ChatCompletionChunk))
    exclude = None if prepared.include_usage or not is_chunk else {"usage"}
    return f"data: {body.model_dump_json(exclude=exclude)}\n\n"
