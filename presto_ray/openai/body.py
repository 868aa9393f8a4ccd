"""A request body as the API's request model: strict UTF-8 JSON (no key twice, no integer past
MAX_INT_DIGITS digits), pydantic's validation with the body's own field paths, the service's
limits on the power-sampling fields, and the OpenAI fields power sampling cannot honour. Every
refusal is an ApiError naming the field."""

from __future__ import annotations

import json
import sys
from typing import Any

from pydantic import ValidationError

from presto_ray.config import error_text
from presto_ray.openai.errors import ApiError
from presto_ray.openai.protocol import _Request
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
# Python's own bound on the digits of an int read from text (sys.get_int_max_str_digits; reading
# takes time quadratic in the digits): json.loads raised a ValueError past it (a 500). A body's
# integer may have at most this many digits, whatever the interpreter allows (a 400 naming it).
MAX_INT_DIGITS = 4300


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
