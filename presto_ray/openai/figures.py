"""The chains' figures over HTTP: the one mapping from SampleStats (presto_ray/results.py, counted
by the chain) to the names clients read, used by every shape that shows them: a choice's
`power_sampling`, `usage.power_sampling` and the streamed progress event."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel

from presto_ray.openai.protocol import PowerSamplingStats, PowerSamplingUsage, ProgressEvent
from presto_ray.results import SampleStats

# HTTP name -> SampleStats field or property. Only the prompt tokens are renamed: over HTTP
# `prompt_tokens` is OpenAI's count of the request's prompt, sent once; the chains' are prefill.
HTTP_FIGURES: dict[str, str] = {
    "rounds": "rounds",
    "stream_batches": "stream_batches",
    "transitions": "transitions",
    "accepted": "accepted",
    "acceptance_rate": "acceptance_rate",
    "transitions_per_round": "transitions_per_round",
    "transitions_per_stream_batch": "transitions_per_stream_batch",
    "requests": "requests",
    "generated_tokens": "generated_tokens",
    "prefill_tokens": "prompt_tokens",
    "cached_prefill_tokens": "cached_prompt_tokens",
    "aborted_requests": "aborted_requests",
    "early_stopped_requests": "early_stopped_requests",
    "early_stop_tokens_left": "early_stop_tokens_left",
}


def figures(stats: SampleStats, shape: type[BaseModel]) -> dict[str, int | float]:
    """The figures `shape` declares, read from `stats` under their HTTP names (a shape's field
    missing from HTTP_FIGURES is left out, and the shape then refuses to be built without it)."""
    return {name: getattr(stats, HTTP_FIGURES[name]) for name in shape.model_fields if name in HTTP_FIGURES}


def choice_figures(stats: SampleStats, seed: int) -> PowerSamplingStats:
    """A choice's `power_sampling`: its chain's seed and figures."""
    return PowerSamplingStats.model_validate({"seed": seed, **figures(stats, PowerSamplingStats)})


def usage_figures(stats: Iterable[SampleStats]) -> PowerSamplingUsage:
    """`usage.power_sampling`: the request's chains' figures, summed."""
    total = SampleStats()
    for s in stats:
        total.add(s)
    return PowerSamplingUsage.model_validate(figures(total, PowerSamplingUsage))


def progress_event(stats: SampleStats, events_done: int, events_total: int) -> ProgressEvent:
    """A chain's running figures after a round, and how far it is."""
    return ProgressEvent.model_validate({**figures(stats, ProgressEvent), "events_done": events_done, "events_total": events_total})
