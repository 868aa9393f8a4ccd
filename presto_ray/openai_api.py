"""The OpenAI completions API with power-sampling fields: parsing, validation, response bodies.

Pure functions over pydantic models (no Ray, no HTTP server), so every rule is unit-testable.
Mapping to power sampling:
  - `n` chains, one per choice; choice i uses seed derive_seed(seed, i). Without `seed` the
    service draws one and returns it in `power_sampling.seed`, so any answer can be reproduced.
  - `max_tokens` is the horizon: one block of max_tokens tokens, or max_tokens / block_size
    blocks when `block_size` is given (it must divide max_tokens: truncating a longer power
    sample would not follow the power law of the shorter one).
  - `temperature` t in (0, 1] maps to alpha = 1/t (p0^alpha is p0 sharpened as by temperature
    1/alpha, but over whole sequences); 0 and values above 1 are rejected. With both fields
    they must agree.
  - `alpha`, `mh_steps`, `prefetch_budget`, `traversal`, `sampler` are accepted in the body, so
    the openai client's `extra_body` reaches them.
  - Fields that would change the law or that power sampling cannot honour (`logprobs`, `stop`,
    `echo`, `suffix`, `logit_bias`, `best_of`, tools, non-neutral `top_p` or penalties) are
    rejected with a message naming them, never silently ignored.
"""

from __future__ import annotations

import json
import math
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from presto_ray.config import SamplerConfig
from presto_ray.serve_config import ServeSettings

UNSUPPORTED_FIELDS = (
    "logprobs", "top_logprobs", "echo", "suffix", "stop", "logit_bias", "best_of",
    "tools", "tool_choice", "functions", "function_call", "response_format",
)  # fmt: skip
NEUTRAL_VALUES = {"top_p": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}


class ApiError(Exception):
    """An error with its HTTP status and an OpenAI-style body naming the offending field."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


class _Request(BaseModel):
    # strict: "3" is not a number and 1 is not a bool; unknown fields are checked by hand
    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1)
    seed: int | None = Field(None, ge=0, lt=2**62)
    temperature: float | None = None
    top_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    stream: bool = False
    stream_options: dict | None = None
    user: str | None = None
    # power sampling
    alpha: float | None = None
    mh_steps: int | None = None
    block_size: int | None = Field(None, ge=1)
    prefetch_budget: int | None = None
    traversal: str | None = None
    sampler: str | None = None


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)


def parse_request(raw: bytes, model: type[_Request], max_bytes: int) -> _Request:
    """The request body as `model`, or an ApiError (413 too large, 400 malformed or invalid)."""
    if len(raw) > max_bytes:
        raise ApiError(413, f"request body is {len(raw)} bytes; the limit is {max_bytes}")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"malformed JSON body: {e}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    try:
        request = model.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        param = str(first["loc"][0]) if first["loc"] else None  # the top-level field, as OpenAI names it
        where = ".".join(str(p) for p in first["loc"] if isinstance(p, int) or p in ("role", "content") or p == param)
        raise ApiError(400, f"{where or 'body'}: {first['msg']}", param) from None
    for name in UNSUPPORTED_FIELDS:
        if data.get(name) not in (None, False):
            raise ApiError(400, f"{name} is not supported by power sampling", name)
    for name, neutral in NEUTRAL_VALUES.items():
        value = getattr(request, name)
        if value is not None and value != neutral:
            raise ApiError(400, f"{name} must be {neutral} (or absent): power sampling draws from p0^alpha", name)
    return request


def sampler_config(request: _Request, base: SamplerConfig, settings: ServeSettings) -> SamplerConfig:
    """The chain configuration a request asks for (its seed is set per choice later)."""
    max_tokens = request.max_tokens or settings.default_max_tokens
    if max_tokens > settings.max_tokens_limit:
        raise ApiError(400, f"max_tokens must be at most {settings.max_tokens_limit}", "max_tokens")
    if request.n > settings.max_n:
        raise ApiError(400, f"n must be at most {settings.max_n}", "n")
    block_size = request.block_size or max_tokens
    if max_tokens % block_size:
        raise ApiError(400, f"max_tokens ({max_tokens}) must be a multiple of block_size ({block_size})", "block_size")
    updates: dict = {"block_size": block_size, "num_blocks": max_tokens // block_size}
    alpha = request.alpha
    if request.temperature is not None:
        t = request.temperature
        if not 0.0 < t <= 1.0:
            raise ApiError(400, "temperature must be in (0, 1]: it sets alpha = 1/temperature", "temperature")
        if alpha is not None and not math.isclose(alpha, 1.0 / t, rel_tol=1e-9):
            raise ApiError(400, f"temperature {t} means alpha {1 / t:g}, but alpha is {alpha:g}", "temperature")
        alpha = 1.0 / t
    if alpha is not None:
        updates["alpha"] = alpha
    if request.mh_steps is not None:
        if request.mh_steps > settings.max_mh_steps:
            raise ApiError(400, f"mh_steps must be at most {settings.max_mh_steps}", "mh_steps")
        updates["mh_steps"] = request.mh_steps
    if request.prefetch_budget is not None:
        if request.prefetch_budget > settings.max_prefetch_budget:
            raise ApiError(400, f"prefetch_budget must be at most {settings.max_prefetch_budget}", "prefetch_budget")
        updates["prefetch_budget"] = request.prefetch_budget
    for name in ("traversal", "sampler"):
        if getattr(request, name) is not None:
            updates[name] = getattr(request, name)
    try:
        return SamplerConfig.model_validate({**base.model_dump(), **updates})
    except ValidationError as e:
        first = e.errors()[0]
        param = str(first["loc"][0]) if first["loc"] else None
        raise ApiError(400, f"{param}: {first['msg']}", param) from None


def check_prompt(token_ids: list[int], max_tokens: int, context: int, vocab_size: int | None) -> None:
    if not token_ids:
        raise ApiError(400, "prompt is empty", "prompt")
    if vocab_size is not None and any(not 0 <= t < vocab_size for t in token_ids):
        raise ApiError(400, f"prompt token ids must be in [0, {vocab_size})", "prompt")
    if len(token_ids) + max_tokens > context:
        raise ApiError(
            400,
            f"prompt ({len(token_ids)} tokens) + max_tokens ({max_tokens}) exceeds the model's context of {context} tokens",
            "prompt",
        )


# --- response bodies -------------------------------------------------------------------------
def choice_stats(stats, seed: int) -> dict:
    return {
        "seed": seed,
        "model_calls": stats.model_calls,
        "transitions": stats.transitions,
        "accepted": stats.accepted,
        "acceptance_rate": stats.acceptance_rate,
        "transitions_per_call": stats.transitions_per_call,
        "requests": stats.requests,
    }


def completion_body(rid: str, model: str, chat: bool, choices: list[dict], prompt_tokens: int, seed: int) -> dict:
    """`choices`: dicts with index, text, finish_reason, power_sampling."""
    completion_tokens = sum(c.pop("completion_tokens", 0) for c in choices)
    if chat:
        choices = [
            {"index": c["index"], "message": {"role": "assistant", "content": c["text"]},
             "finish_reason": c["finish_reason"], "power_sampling": c["power_sampling"]}
            for c in choices
        ]  # fmt: skip
    else:
        choices = [{**c, "logprobs": None} for c in choices]
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "power_sampling": {"seed": seed},
    }


def chunk_body(rid: str, model: str, chat: bool, index: int, text: str | None, finish_reason, extra: dict) -> dict:
    """One server-sent event: progress (no text) or a choice's final text."""
    if chat:
        delta = {"role": "assistant", "content": text} if text is not None else {}
        choice = {"index": index, "delta": delta, "finish_reason": finish_reason}
    else:
        choice = {"index": index, "text": text or "", "finish_reason": finish_reason, "logprobs": None}
    return {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "power_sampling": extra,
    }
