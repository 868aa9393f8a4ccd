"""From a request body to the chains it asks for: the body parsed (body.py), the model check,
the sampler configuration and its work bounds (work_bounds.py), the prompt rules, and the seeds (choice i's chain uses derive_seed(seed, i); a request without one gets a drawn one).
Every refusal is an ApiError naming the field."""

from __future__ import annotations

import math
import random
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from presto_ray.config import MAX_ALPHA, SamplerConfig, error_field, error_text
from presto_ray.engines.base import Tokenizer
from presto_ray.keys import derive_seed
from presto_ray.openai.body import parse_request
from presto_ray.openai.errors import ApiError
from presto_ray.openai.protocol import MIN_TEMPERATURE, ChatRequest, CompletionRequest, _Request
from presto_ray.openai.work_bounds import check_work
from presto_ray.prompts import unencodable_text
from presto_ray.serve_config import ServeConfig

DRAWN_SEED_BOUND = 2**31  # a seed the service draws stays short enough to copy by hand


@dataclass(frozen=True)
class Prepared:
    """A valid request, ready to run: one chain per choice, and what its bodies will name."""

    id: str  # "cmpl-..." or "chatcmpl-...": the response id, and the prefix of its chain ids
    chat: bool  # which API asked: its renderer shapes every body (render.py)
    stream: bool
    model: str
    prompt_ids: list[int]
    seed: int  # the request's seed, given or drawn
    configs: list[SamplerConfig]  # choice i's chain, with seed derive_seed(seed, i)
    logprobs: bool = False  # return each choice's per-token log p0
    include_usage: bool = False  # streaming: a last chunk with the usage


def request_model(chat: bool) -> type[CompletionRequest] | type[ChatRequest]:
    """The API's request model (its OpenAPI body too); its bodies are render.py's `renderer`."""
    return ChatRequest if chat else CompletionRequest


def prepare(
    raw_body: bytes,
    chat: bool,
    *,
    tokenizer: Tokenizer,
    model_name: str,
    context_length: int,
    base_sampler: SamplerConfig,
    settings: ServeConfig,
) -> Prepared:
    """The chains a request body asks for, or an ApiError naming what is wrong with it."""
    model = request_model(chat)
    request = parse_request(raw_body, model, settings.max_body_bytes, settings)
    check_model(request, model_name)
    config = sampler_config(request, base_sampler, settings)
    prompt = prompt_ids(request, tokenizer)
    check_prompt(prompt, config.horizon, context_length, tokenizer.vocab_size, max_tokens_field(request))
    seed = request.seed if request.seed is not None else random.randrange(DRAWN_SEED_BOUND)
    return Prepared(
        id=f"{model.id_prefix}-{uuid.uuid4().hex[:24]}",
        chat=chat,
        stream=request.stream,
        model=model_name,
        prompt_ids=prompt,
        seed=seed,
        configs=[config.model_copy(update={"seed": derive_seed(seed, i)}) for i in range(request.n)],
        logprobs=request.wants_logprobs(),
        include_usage=bool(request.stream_options and request.stream_options.include_usage),
    )


def check_model(request: _Request, model_name: str) -> None:
    """A request may leave `model` out; naming another model is a 404, as OpenAI answers it."""
    if request.model is not None and request.model != model_name:
        message = f"the model {request.model!r} does not exist; this service serves {model_name!r}"
        raise ApiError(404, message, "model", "not_found_error")


def max_tokens_field(request: _Request) -> str:
    """The name the request gave its horizon: chat's max_completion_tokens (OpenAI's current
    name), or max_tokens. Messages about the horizon use it."""
    if isinstance(request, ChatRequest) and request.max_completion_tokens is not None:
        return "max_completion_tokens"
    return "max_tokens"


def requested_max_tokens(request: _Request) -> int | None:
    """The horizon a request asks for; chat may name it max_completion_tokens or max_tokens, and
    with both they must agree (which one would the client have meant?)."""
    if isinstance(request, ChatRequest) and request.max_completion_tokens is not None:
        given = request.max_completion_tokens
        if request.max_tokens is not None and request.max_tokens != given:
            message = (
                f"max_completion_tokens ({given}) and max_tokens ({request.max_tokens}) differ: "
                "send one of them (max_completion_tokens is OpenAI's current name)"
            )
            raise ApiError(400, message, "max_completion_tokens")
        return given
    return request.max_tokens


def sampler_config(request: _Request, base: SamplerConfig, settings: ServeConfig) -> SamplerConfig:
    """The chain configuration a request asks for (its seed is set per choice later)."""
    tokens_field = max_tokens_field(request)
    max_tokens = requested_max_tokens(request) or settings.default_max_tokens
    if max_tokens > settings.max_tokens_limit:
        raise ApiError(400, f"{tokens_field} must be at most {settings.max_tokens_limit}", tokens_field)
    if request.n > settings.max_n:
        raise ApiError(400, f"n must be at most {settings.max_n}", "n")
    block_size = request.block_size or max_tokens
    if max_tokens % block_size:
        message = f"{tokens_field} ({max_tokens}) must be a multiple of block_size ({block_size})"
        raise ApiError(400, message, "block_size")
    updates: dict[str, Any] = {"block_size": block_size, "num_blocks": max_tokens // block_size}
    alpha = request.alpha
    if request.temperature is not None:
        t = request.temperature
        if not MIN_TEMPERATURE <= t <= 1.0:
            message = f"temperature must be in [{MIN_TEMPERATURE:g}, 1]: it sets alpha = 1/temperature (at most {MAX_ALPHA:g})"
            raise ApiError(400, message, "temperature")
        if alpha is not None and not math.isclose(alpha, 1.0 / t, rel_tol=1e-9):
            raise ApiError(400, f"temperature {t} means alpha {1 / t:g}, but alpha is {alpha:g}", "temperature")
        alpha = 1.0 / t
    if alpha is not None:
        updates["alpha"] = alpha
    if request.mh_steps is not None:
        if request.mh_steps > settings.max_mh_steps:
            message = f"mh_steps must be at most {settings.max_mh_steps} (raise serve.max_mh_steps in the job config)"
            raise ApiError(400, message, "mh_steps")
        updates["mh_steps"] = request.mh_steps
    if request.prefetch_budget is not None:
        if request.prefetch_budget > settings.max_prefetch_budget:
            message = f"prefetch_budget must be at most {settings.max_prefetch_budget} (raise serve.max_prefetch_budget in the job config)"
            raise ApiError(400, message, "prefetch_budget")
        updates["prefetch_budget"] = request.prefetch_budget
    if request.traversal is not None:
        updates["traversal"] = request.traversal
    if request.sampler is not None:
        updates["sampler"] = request.sampler
    try:
        config = SamplerConfig.model_validate({**base.model_dump(), **updates})
    except ValidationError as e:
        first = dict(e.errors()[0])
        # the request's name for a chain field: the horizon's block count comes from max_tokens
        field = error_field(first)
        param = {"num_blocks": tokens_field}.get(field or "", field) or "body"
        raise ApiError(400, f"{param}: {error_text(first)}", param) from None
    check_work(config, request.n, settings, tokens_field)
    return config


def prompt_ids(request: _Request, tokenizer: Tokenizer) -> list[int]:
    """Chat messages through the chat template; a text prompt as it is (completions never wrap
    it in a template); token ids unchanged. One prompt per request: `n` samples it several times."""
    if isinstance(request, ChatRequest):
        for i, message in enumerate(request.messages):
            _check_encodable(message.content, f"messages.{i}.content", "messages")
        return list(tokenizer.apply_chat_template([m.model_dump() for m in request.messages]))
    if not isinstance(request, CompletionRequest):
        raise TypeError(f"not a request of either API: {type(request).__name__}")
    prompt = request.prompt
    if isinstance(prompt, str):
        _check_encodable(prompt, "prompt", "prompt")
        return tokenizer.encode_raw(prompt) if prompt else []
    texts = [p for p in prompt if isinstance(p, str)]
    if prompt and len(texts) == len(prompt):
        _check_encodable(texts[0], "prompt.0", "prompt")
        if len(texts) != 1:
            raise ApiError(400, "one prompt per request (use n for several samples of it)", "prompt")
        return tokenizer.encode_raw(texts[0]) if texts[0] else []
    return [p for p in prompt if isinstance(p, int)]  # all of them: the model admits no mixed list


def _check_encodable(text: str, where: str, param: str) -> None:
    """A JSON string may hold a lone surrogate ("\\ud800"), which no tokenizer can encode."""
    if (problem := unencodable_text(text)) is not None:
        raise ApiError(400, f"{where}: {problem}", param)


def check_prompt(token_ids: list[int], max_tokens: int, context: int, vocab_size: int, tokens_field: str = "max_tokens") -> None:
    if not token_ids:
        raise ApiError(400, "prompt is empty", "prompt")
    if any(not 0 <= t < vocab_size for t in token_ids):
        raise ApiError(400, f"prompt token ids must be in [0, {vocab_size})", "prompt")
    if len(token_ids) + max_tokens > context:
        raise ApiError(
            400,
            f"prompt ({_tokens(len(token_ids))}) + {tokens_field} ({max_tokens}) exceeds the model's context of {context} tokens",
            "prompt",
        )


def _tokens(count: int) -> str:
    return f"{count} token" if count == 1 else f"{count} tokens"
