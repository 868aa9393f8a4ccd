"""From a request body to the chains it asks for: parsing and the fields power sampling cannot
honour, the model check, the sampler configuration and the work bounds, the prompt rules, and
the seeds (choice i's chain uses derive_seed(seed, i); a request without one gets a drawn one).
Every refusal is an ApiError naming the field."""

from __future__ import annotations

import json
import math
import random
import sys
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from presto_ray.config import MAX_ALPHA, SamplerConfig, error_field, error_text
from presto_ray.engines.base import Tokenizer
from presto_ray.keys import derive_seed
from presto_ray.openai.errors import ApiError
from presto_ray.openai.protocol import MIN_TEMPERATURE, ChatRequest, CompletionRequest, _Request
from presto_ray.prompts import unencodable_text
from presto_ray.serve_config import ServeConfig

# OpenAI (and vLLM) fields power sampling cannot honour, each with the values that ask for nothing
# and so may pass (an SDK or a proxy often sends them); any other value is a 400 naming the field
UNSUPPORTED_FIELDS: dict[str, tuple[object, ...]] = {
    "top_logprobs": (0,), "echo": (False,), "suffix": ("",), "stop": ([],),
    "logit_bias": ({},), "best_of": (1,), "tools": ([],), "tool_choice": ("none",), "functions": ([],),
    "function_call": ("none",), "response_format": ({"type": "text"},), "parallel_tool_calls": (False,),
    "top_k": (0, -1), "min_p": (0, 0.0), "repetition_penalty": (1, 1.0),
}  # fmt: skip
NEUTRAL_VALUES = {"top_p": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}
DRAWN_SEED_BOUND = 2**31  # a seed the service draws stays short enough to copy by hand
# Python's own bound on the digits of an int read from text (sys.get_int_max_str_digits; reading
# takes time quadratic in the digits): json.loads raised a ValueError past it (a 500). A body's
# integer may have at most this many digits, whatever the interpreter allows (a 400 naming it).
MAX_INT_DIGITS = 4300


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


class _LongInteger:
    """What the parser keeps of an integer with more than MAX_INT_DIGITS digits: its length."""

    __slots__ = ("digits",)

    def __init__(self, digits: int) -> None:
        self.digits = digits


def _int_digits_limit() -> int:
    allowed = sys.get_int_max_str_digits()  # 0: the interpreter has no bound (ours still holds)
    return min(MAX_INT_DIGITS, allowed) if allowed else MAX_INT_DIGITS


def _long_integer_at(data: Any) -> tuple[tuple[str | int, ...], int] | None:
    """Where the first over-long integer of a parsed body is (its path of keys and indices), and
    its digits; None if there is none. Iterative: the body may be nested a thousand deep."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _LongInteger):
            return path, value.digits
        if isinstance(value, dict):
            stack.extend(((*path, k), v) for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend(((*path, i), v) for i, v in reversed(list(enumerate(value))))
    return None


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object_pairs_hook: a key twice in one object is refused (which one a proxy or a
    logger read would otherwise differ from what the service used: the last)."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise ApiError(400, f"malformed JSON body: the key {key!r} appears more than once in an object", key)
        data[key] = value
    return data


# pydantic's messages that name a model class ("a valid dictionary or instance of StreamOptions")
_OBJECT_ERRORS = {"model_type", "model_attributes_type", "dict_type"}


def _error_message(error: dict[str, Any]) -> str:
    if error.get("type") in _OBJECT_ERRORS:
        return "must be a JSON object"
    if error.get("type") == "extra_forbidden":
        return "unknown field: this API does not know it (is it misspelled?)"
    return error_text(error)


def _where(loc: tuple[Any, ...]) -> str:
    """A pydantic error's location as the body's field path ("messages.0.contnet"), without the
    union arms pydantic adds ("str", "list[int]", a model's class name)."""
    return ".".join(str(p) for p in loc if isinstance(p, int) or (isinstance(p, str) and not _is_arm(p)))


_ARMS = {"str", "int", "float", "bool", "list", "dict", "StreamOptions", "ChatMessage"}


def _is_arm(part: str) -> bool:
    return "[" in part or part in _ARMS


def parse_request(raw: bytes, model: type[_Request], max_bytes: int, settings: ServeConfig | None = None) -> _Request:
    """The request body as `model`, or an ApiError (413 too large, 400 malformed or invalid).
    `settings`: the service's limits, checked before the sampler's wider ones."""
    if len(raw) > max_bytes:
        raise ApiError(413, f"request body is {len(raw)} bytes; the limit is {max_bytes}")
    try:
        text = raw.decode("utf-8")  # strictly: json.loads would guess UTF-16 or UTF-32 from bytes
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the body must be UTF-8 JSON: {e.reason} at byte {e.start}") from None
    if text.startswith("\ufeff"):
        raise ApiError(400, "the body must be UTF-8 JSON without a byte order mark")
    limit = _int_digits_limit()
    long_integers = 0

    def parse_int(digits: str) -> int | _LongInteger:
        nonlocal long_integers
        count = len(digits) - digits.startswith("-")
        if count > limit:
            long_integers += 1
            return _LongInteger(count)
        return int(digits)

    try:
        data = json.loads(text, object_pairs_hook=_refuse_duplicates, parse_int=parse_int)
    except json.JSONDecodeError as e:
        raise ApiError(400, f"malformed JSON body: {e}") from None
    except RecursionError:
        raise ApiError(400, "malformed JSON body: nested too deeply") from None
    except ValueError as e:  # anything else the parser refuses is the body's fault too, never a 500
        raise ApiError(400, f"malformed JSON body: {e}") from None
    if long_integers and (found := _long_integer_at(data)) is not None:
        path, digits = found
        where = ".".join(str(p) for p in path) or "body"
        param = str(path[0]) if path else None
        raise ApiError(400, f"{where}: an integer of {digits:,} digits; integers may have at most {limit:,}", param)
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    if settings is not None:
        check_service_limits(data, settings)
    try:
        request = model.model_validate(data)
    except ValidationError as e:
        first = dict(e.errors()[0])
        loc = tuple(e.errors()[0]["loc"])
        param = str(loc[0]) if loc else None  # the top-level field, as OpenAI names it
        where = _where(loc)
        raise ApiError(400, f"{where or 'body'}: {_error_message(first)}", param) from None
    except RecursionError:  # a nested value pydantic walks (stream_options) deeper than the stack
        raise ApiError(400, "the body is nested too deeply") from None
    check_unsupported(request)
    return request


def check_service_limits(data: dict[str, Any], settings: ServeConfig) -> None:
    """The service's own limits on the power-sampling fields, before the sampler's wider ones: a
    request over serve.max_mh_steps hears that limit, not the sampler's 1,000,000."""
    limits = (("mh_steps", settings.max_mh_steps, "max_mh_steps"), ("prefetch_budget", settings.max_prefetch_budget, "max_prefetch_budget"))
    for name, limit, key in limits:
        value = data.get(name)
        if type(value) is int and value > limit:
            raise ApiError(400, f"{name} must be at most {limit} (raise serve.{key} in the job config)", name)


def check_unsupported(request: _Request) -> None:
    """Unknown fields, and fields power sampling cannot honour unless they ask for nothing."""
    for name, value in (request.model_extra or {}).items():
        if name not in UNSUPPORTED_FIELDS:
            raise ApiError(400, f"unknown field {name!r}: this API does not know it (is it misspelled?)", name)
        if value is not None and not any(type(value) is type(n) and value == n for n in UNSUPPORTED_FIELDS[name]):
            allowed = " or ".join(json.dumps(n) for n in UNSUPPORTED_FIELDS[name])
            raise ApiError(400, f"{name} is not supported by power sampling (only {allowed} or absent)", name)
    for name, neutral in NEUTRAL_VALUES.items():
        value = getattr(request, name)
        if value is not None and value != neutral:
            raise ApiError(400, f"{name} must be {neutral} (or absent): power sampling draws from p0^alpha", name)
    for name in ("logprobs", "top_logprobs"):
        value = getattr(request, name, None)
        if type(value) is int and value > 0:
            message = (
                f"{name} must be 0 (or absent): a power sample has no per-token top alternatives; "
                "0 returns each sampled token's log p0"
            )
            raise ApiError(400, message, name)
    if request.stream_options is not None and not request.stream:
        raise ApiError(400, "stream_options is only allowed with stream: true", "stream_options")


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


def request_work(config: SamplerConfig, n: int) -> int:
    """A request's work in token-steps: n chains x K steps x blocks x horizon. Block l's K steps
    each propose up to l * block_size tokens, so a chain's tokens grow as K * num_blocks * horizon / 2."""
    return n * max(config.mh_steps, 1) * config.num_blocks * config.horizon


def requests_per_event(config: SamplerConfig) -> int:
    """The most proposal requests a chain issues per event of its schedule, as the planner issues
    them: its prefetch budget (each round's requests, the root's included, fit in it; MultiTryMH's
    num_tries count one each), or under serial traversal the event's own requests only (one, or
    MultiTryMH's num_tries)."""
    if config.traversal == "serial":
        return config.num_tries if config.sampler == "multi_try" else 1
    return config.prefetch_budget


def request_token_bound(config: SamplerConfig, n: int) -> int:
    """An upper bound on the tokens a request's chains generate (usage.power_sampling.
    generated_tokens, speculative and rejected proposals included): n chains x events (blocks x
    (mh_steps + 1): each block's extension and its K steps) x requests per event
    (`requests_per_event`) x tokens per request (at most the horizon, max_tokens). Rounds: each
    round issues at most requests_per_event requests and completes at least one event (the root's
    request carries the walk's own bound, so it is never unusable), so this holds; streaming keeps
    at most as many requests running, and on the toy engine it issued at most one request per event
    and unit of budget in every configuration tried (tests/test_request_bound.py)."""
    events = config.num_blocks * (config.mh_steps + 1)
    return n * events * requests_per_event(config) * config.horizon


def check_work(config: SamplerConfig, n: int, settings: ServeConfig, tokens_field: str = "max_tokens") -> None:
    """One request must not hold the engines for hours: bound its blocks, its total work and the
    tokens it may generate."""
    if config.num_blocks > settings.max_num_blocks:
        message = (
            f"{tokens_field} / block_size gives {config.num_blocks} blocks; the limit is {settings.max_num_blocks} "
            "(use a larger block_size, or raise serve.max_num_blocks in the job config)"
        )
        raise ApiError(400, message, "block_size")
    work = request_work(config, n)
    if work > settings.max_request_work:
        message = (
            f"the request asks for {work:,} token-steps (n {n} x mh_steps {config.mh_steps} x {config.num_blocks} "
            f"blocks x {tokens_field} {config.horizon}); the limit is {settings.max_request_work:,} "
            "(ask for less, or raise serve.max_request_work in the job config)"
        )
        raise ApiError(400, message, "mh_steps")
    bound = request_token_bound(config, n)
    if bound > settings.max_request_tokens:
        per_event = requests_per_event(config)
        source = "prefetch_budget" if config.traversal != "serial" else "serial traversal"
        blocks = f"{config.num_blocks} block{'s' if config.num_blocks != 1 else ''}"
        message = (
            f"the request may generate up to {bound:,} tokens (usage.power_sampling.generated_tokens: n {n} x "
            f"{config.num_blocks * (config.mh_steps + 1):,} events ({blocks} x (mh_steps {config.mh_steps} + 1)) x "
            f"{per_event} requests per event ({source}) x {config.horizon:,} tokens per request ({tokens_field})); "
            f"the limit is {settings.max_request_tokens:,} (ask for fewer choices, steps, tokens or a smaller "
            "prefetch_budget, or raise serve.max_request_tokens in the job config)"
        )
        raise ApiError(400, message, "mh_steps")


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
