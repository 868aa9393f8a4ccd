"""The whole HTTP contract of the service: the OpenAI completions and chat APIs with power sampling.

It owns the request fields and their validation, the model check, the prompt rules, the seeds and
every response body (pydantic models: the JSON clients see is declared here, nowhere else). Pure
functions, no Ray and no HTTP server, so every rule is unit-testable. deployments/serve_app.py
only moves bytes: it calls `prepare`, runs the chains it describes, and sends the bodies built here.

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
  - `logprobs` (completions: 0; chat: true with `top_logprobs` 0) returns the final sample's
    per-token log p0, which the chain computed: the base model's log-probabilities of the returned
    tokens (a power sample has no per-token law of its own, so there are no top alternatives:
    more than 0 is refused). `usage` counts tokens as OpenAI does and adds `usage.power_sampling`,
    what the chains really cost the engines; `stream_options.include_usage` sends it in a last chunk.
  - Fields that would change the law or that power sampling cannot honour (`stop`, `echo`,
    `suffix`, `logit_bias`, `best_of`, tools, `top_k`, `min_p`, non-neutral `top_p` or penalties)
    are rejected with a message naming them, never silently ignored; so is any field this API does
    not know (a typo such as `mh_step`). Their neutral values (`best_of: 1`, `tools: []`, ...) pass.
  - The request models are the OpenAPI schema too (`openapi_route`): /openapi.json lists every
    field with its limits, the power-sampling ones included.
  - Transport rules live here too, as pure functions the ingress calls: the bearer token
    (`check_api_key`), the content type (`check_content_type`), and the body of a 500, which never
    carries internals (`internal_error`: the details go to the server log under an error id).
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import random
import time
import uuid
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer

from presto_ray.config import MAX_ALPHA, SamplerConfig, error_field, error_text
from presto_ray.engines.base import FinishReason, Tokenizer
from presto_ray.keys import derive_seed
from presto_ray.prompts import ChatRole, unencodable_text
from presto_ray.results import SampleResult, SampleStats
from presto_ray.serve_config import ServeSettings

if TYPE_CHECKING:  # the coordinator lives in the Ray layer; this module only reads its snapshot
    from actors.coordinator_stats import CoordinatorSnapshot

# OpenAI (and vLLM) fields power sampling cannot honour, each with the values that ask for nothing
# and so may pass (an SDK or a proxy often sends them); any other value is a 400 naming the field
UNSUPPORTED_FIELDS: dict[str, tuple] = {
    "top_logprobs": (0,), "echo": (False,), "suffix": ("",), "stop": ([],),
    "logit_bias": ({},), "best_of": (1,), "tools": ([],), "tool_choice": ("none",), "functions": ([],),
    "function_call": ("none",), "response_format": ({"type": "text"},), "parallel_tool_calls": (False,),
    "top_k": (0, -1), "min_p": (0, 0.0), "repetition_penalty": (1, 1.0),
}  # fmt: skip
NEUTRAL_VALUES = {"top_p": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}
DRAWN_SEED_BOUND = 2**31  # a seed the service draws stays short enough to copy by hand
MIN_TEMPERATURE = 1.0 / MAX_ALPHA  # temperature t means alpha = 1/t

log = logging.getLogger("presto_ray.serve")


# --- errors ----------------------------------------------------------------------------------
class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class ApiError(Exception):
    """An error with its HTTP status and an OpenAI-style body naming the offending field."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.headers = headers or {}

    def response(self) -> ErrorResponse:
        return ErrorResponse(error=ErrorDetail(message=self.message, type=self.kind, param=self.param))

    def body(self) -> dict:
        return self.response().model_dump()


def internal_error(error: BaseException, request_id: str | None = None) -> ApiError:
    """A failure that is not the client's: logged here in full under an error id, answered with a
    500 that carries only that id (a traceback shows paths, hosts, pids and actor ids)."""
    error_id = f"err-{uuid.uuid4().hex[:16]}"
    log.error("%s (request %s): %s", error_id, request_id or "-", type(error).__name__, exc_info=error)
    return ApiError(500, f"internal server error; the server log has its details under {error_id}", None, "server_error")



def check_api_key(authorization: str | None, api_key: str | None) -> None:
    """`Authorization: Bearer <key>` when the service has a key: the scheme in any case (RFC 7235),
    the key compared in constant time. 401 with `WWW-Authenticate: Bearer` otherwise."""
    if not api_key:
        return
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise ApiError(
            401,
            "missing or wrong API key: send 'Authorization: Bearer <key>'",
            None,
            "invalid_api_key",
            {"WWW-Authenticate": 'Bearer realm="presto-ray"'},
        )


def check_content_type(content_type: str | None) -> None:
    """POST bodies must say they are JSON: a browser form (urlencoded, multipart, text/plain) could
    otherwise start sampling cross-origin without a CORS preflight."""
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        shown = media_type or "none"
        raise ApiError(415, f"Content-Type must be application/json (got {shown})", None, "invalid_request_error")


# --- requests --------------------------------------------------------------------------------
def _power_field(name: str, service_limit: str = ""):
    """A request field that sets SamplerConfig's `name`: its type, limits and description are the
    sampler's own, so the OpenAPI schema shows the same bounds the chain enforces."""
    info = SamplerConfig.model_fields[name]
    constrained = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
    description = f"Power sampling: {info.description}{service_limit}"
    return Annotated[constrained | None, Field(None, description=description)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool | None = Field(
        None, description="Send a last chunk (empty `choices`) with the request's `usage`; every other chunk has `usage: null`."
    )


class _Request(BaseModel):
    # strict: "3" is not a number and 1 is not a bool; finite: Infinity, NaN and 1e400 are refused;
    # unknown fields are checked by hand (to name them, and to let neutral values of unsupported ones pass)
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    model: str | None = Field(None, description="The served model's id (GET /v1/models); may be left out.")
    max_tokens: int | None = Field(
        None, ge=1, description="The horizon: tokens of the final sample (at most serve.max_tokens_limit, 2048 by default)."
    )
    n: int = Field(1, ge=1, description="Choices, one chain each (at most serve.max_n, 16 by default).")
    seed: int | None = Field(
        None, ge=0, lt=2**62, description="Choice i's chain uses derive_seed(seed, i); drawn and returned when absent."
    )
    temperature: float | None = Field(
        None, description=f"t in [{MIN_TEMPERATURE:g}, 1] means alpha = 1/t (0 and values above 1 are refused)."
    )
    top_p: float | None = Field(None, description="Only 1 (or absent): power sampling draws from p0^alpha.")
    frequency_penalty: float | None = Field(None, description="Only 0 (or absent).")
    presence_penalty: float | None = Field(None, description="Only 0 (or absent).")
    stream: bool = Field(False, description="Server-sent events: a progress chunk per chain round, then each choice's text.")
    stream_options: StreamOptions | None = Field(None, description="Only with stream: true.")
    user: str | None = None
    # power sampling
    alpha: _power_field("alpha")
    mh_steps: _power_field("mh_steps", " The service allows at most serve.max_mh_steps (1000 by default).")
    block_size: _power_field("block_size", " It must divide max_tokens.")
    prefetch_budget: _power_field("prefetch_budget", " The service allows at most serve.max_prefetch_budget (256 by default).")
    traversal: _power_field("traversal")
    sampler: _power_field("sampler")

    def wants_logprobs(self) -> bool:
        return False


class CompletionRequest(_Request):
    """POST /v1/completions. Any other OpenAI field is refused with a 400 naming it, unless it has
    its neutral value (`best_of: 1`, `echo: false`, `stop: []`, `top_k: -1`, ...)."""

    prompt: str | list[int] | list[str] = Field(
        description="Text (sent raw, no chat template), a one-item list of text, or token ids."
    )
    logprobs: int | None = Field(
        None,
        ge=0,
        json_schema_extra={"maximum": 0},
        description="0: each returned token's log p0 (the base model's), as tokens/token_logprobs/top_logprobs/"
        "text_offset; a power sample has no per-token top alternatives, so more than 0 is refused.",
    )

    def wants_logprobs(self) -> bool:
        return self.logprobs is not None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: ChatRole
    content: str


class ChatRequest(_Request):
    """POST /v1/chat/completions. Any other OpenAI field is refused with a 400 naming it, unless it
    has its neutral value (`tools: []`, `response_format: {"type": "text"}`, ...)."""

    messages: list[ChatMessage] = Field(min_length=1, description="Through the model's chat template.")
    logprobs: bool | None = Field(None, description="true: each returned token's log p0 (the base model's).")
    top_logprobs: int | None = Field(
        None, ge=0, json_schema_extra={"maximum": 0}, description="Only 0: a power sample has no per-token top alternatives."
    )

    def wants_logprobs(self) -> bool:
        return bool(self.logprobs)


@dataclass(frozen=True)
class Prepared:
    """A valid request, ready to run: one chain per choice, and what its bodies will name."""

    id: str  # "cmpl-..." or "chatcmpl-...": the response id, and the prefix of its chain ids
    chat: bool
    stream: bool
    model: str
    prompt_ids: list[int]
    seed: int  # the request's seed, given or drawn
    configs: list[SamplerConfig]  # choice i's chain, with seed derive_seed(seed, i)
    logprobs: bool = False  # return each choice's per-token log p0
    include_usage: bool = False  # streaming: a last chunk with the usage


def prepare(
    raw_body: bytes,
    chat: bool,
    *,
    tokenizer: Tokenizer,
    model_name: str,
    context_length: int,
    base_sampler: SamplerConfig,
    settings: ServeSettings,
) -> Prepared:
    """The chains a request body asks for, or an ApiError naming what is wrong with it."""
    request = parse_request(raw_body, ChatRequest if chat else CompletionRequest, settings.max_body_bytes)
    check_model(request, model_name)
    config = sampler_config(request, base_sampler, settings)
    prompt = prompt_ids(request, tokenizer)
    check_prompt(prompt, config.horizon, context_length, tokenizer.vocab_size)
    seed = request.seed if request.seed is not None else random.randrange(DRAWN_SEED_BOUND)
    return Prepared(
        id=f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}",
        chat=chat,
        stream=request.stream,
        model=model_name,
        prompt_ids=prompt,
        seed=seed,
        configs=[config.model_copy(update={"seed": derive_seed(seed, i)}) for i in range(request.n)],
        logprobs=request.wants_logprobs(),
        include_usage=bool(request.stream_options and request.stream_options.include_usage),
    )


def parse_request(raw: bytes, model: type[_Request], max_bytes: int) -> _Request:
    """The request body as `model`, or an ApiError (413 too large, 400 malformed or invalid)."""
    if len(raw) > max_bytes:
        raise ApiError(413, f"request body is {len(raw)} bytes; the limit is {max_bytes}")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"malformed JSON body: {e}") from None
    except RecursionError:
        raise ApiError(400, "malformed JSON body: nested too deeply") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    try:
        request = model.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        param = str(first["loc"][0]) if first["loc"] else None  # the top-level field, as OpenAI names it
        where = ".".join(str(p) for p in first["loc"] if isinstance(p, int) or p in ("role", "content") or p == param)
        raise ApiError(400, f"{where or 'body'}: {error_text(first)}", param) from None
    except RecursionError:  # a nested value pydantic walks (stream_options) deeper than the stack
        raise ApiError(400, "the body is nested too deeply") from None
    for name, value in (request.model_extra or {}).items():
        if name not in UNSUPPORTED_FIELDS:
            raise ApiError(400, f"unknown field {name!r}: this API does not know it (is it misspelled?)", name)
        if value is not None and not any(type(value) is type(n) and value == n for n in UNSUPPORTED_FIELDS[name]):
            neutral = " or ".join(json.dumps(n) for n in UNSUPPORTED_FIELDS[name])
            raise ApiError(400, f"{name} is not supported by power sampling (only {neutral} or absent)", name)
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
    return request


def check_model(request: _Request, model_name: str) -> None:
    """A request may leave `model` out; naming another model is a 404, as OpenAI answers it."""
    if request.model is not None and request.model != model_name:
        message = f"the model {request.model!r} does not exist; this service serves {model_name!r}"
        raise ApiError(404, message, "model", "not_found_error")


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
        config = SamplerConfig.model_validate({**base.model_dump(), **updates})
    except ValidationError as e:
        first = e.errors()[0]
        # the request's name for a chain field: the horizon's block count comes from max_tokens
        param = {"num_blocks": "max_tokens"}.get(error_field(first) or "", error_field(first)) or "body"
        raise ApiError(400, f"{param}: {error_text(first)}", param) from None
    check_work(config, request.n, settings)
    return config


def request_work(config: SamplerConfig, n: int) -> int:
    """A request's work in token-steps: n chains x K steps x blocks x horizon. Block l's K steps
    each propose up to l * block_size tokens, so a chain's tokens grow as K * num_blocks * horizon / 2."""
    return n * max(config.mh_steps, 1) * config.num_blocks * config.horizon


def check_work(config: SamplerConfig, n: int, settings: ServeSettings) -> None:
    """One request must not hold the engines for hours: bound its blocks and its total work."""
    if config.num_blocks > settings.max_num_blocks:
        message = (
            f"max_tokens / block_size gives {config.num_blocks} blocks; the limit is {settings.max_num_blocks} "
            "(use a larger block_size, or raise serve.max_num_blocks in the job config)"
        )
        raise ApiError(400, message, "block_size")
    work = request_work(config, n)
    if work > settings.max_request_work:
        message = (
            f"the request asks for {work:,} token-steps (n {n} x mh_steps {config.mh_steps} x {config.num_blocks} "
            f"blocks x max_tokens {config.horizon}); the limit is {settings.max_request_work:,} "
            "(ask for less, or raise serve.max_request_work in the job config)"
        )
        raise ApiError(400, message, "mh_steps")


def prompt_ids(request: _Request, tokenizer: Tokenizer) -> list[int]:
    """Chat messages through the chat template; a text prompt as it is (completions never wrap
    it in a template); token ids unchanged. One prompt per request: `n` samples it several times."""
    if isinstance(request, ChatRequest):
        for i, message in enumerate(request.messages):
            _check_encodable(message.content, f"messages.{i}.content", "messages")
        return list(tokenizer.apply_chat_template([m.model_dump() for m in request.messages]))
    prompt = request.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        _check_encodable(prompt[0], "prompt.0", "prompt")
    if isinstance(prompt, str):
        _check_encodable(prompt, "prompt", "prompt")
        return tokenizer.encode_raw(prompt) if prompt else []
    if prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) != 1:
            raise ApiError(400, "one prompt per request (use n for several samples of it)", "prompt")
        return tokenizer.encode_raw(prompt[0]) if prompt[0] else []
    return list(prompt)


def _check_encodable(text: str, where: str, param: str) -> None:
    """A JSON string may hold a lone surrogate ("\\ud800"), which no tokenizer can encode."""
    if (problem := unencodable_text(text)) is not None:
        raise ApiError(400, f"{where}: {problem}", param)


def check_prompt(token_ids: list[int], max_tokens: int, context: int, vocab_size: int) -> None:
    if not token_ids:
        raise ApiError(400, "prompt is empty", "prompt")
    if any(not 0 <= t < vocab_size for t in token_ids):
        raise ApiError(400, f"prompt token ids must be in [0, {vocab_size})", "prompt")
    if len(token_ids) + max_tokens > context:
        raise ApiError(
            400,
            f"prompt ({len(token_ids)} tokens) + max_tokens ({max_tokens}) exceeds the model's context of {context} tokens",
            "prompt",
        )


# --- response bodies -------------------------------------------------------------------------
def _now() -> int:
    return int(time.time())


class PowerSamplingStats(BaseModel):
    """One choice's chain: the seed that reproduces it and what it cost."""

    seed: int
    rounds: int
    stream_batches: int
    transitions: int
    accepted: int
    acceptance_rate: float
    transitions_per_round: float
    transitions_per_stream_batch: float
    requests: int


class RequestSeed(BaseModel):
    """The top-level `power_sampling`: the request's seed, given or drawn."""

    seed: int


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


class CompletionLogprobs(BaseModel):
    """OpenAI's completions `logprobs` with `logprobs: 0`: the sampled tokens only (each
    top_logprobs entry holds just the sampled token, as OpenAI's "up to logprobs + 1" allows)."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]  # where each token starts in the choice's text


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = []  # top_logprobs is 0: no alternatives


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob]
    refusal: None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: FinishReason
    power_sampling: PowerSamplingStats
    logprobs: CompletionLogprobs | None = None  # only when asked: the final sample's log p0 per token


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    finish_reason: FinishReason
    power_sampling: PowerSamplingStats
    logprobs: ChatLogprobs | None = None


class PowerSamplingUsage(BaseModel):
    """`usage.power_sampling`: what the request's chains really cost the engines, summed over its n
    chains. A power sample is drawn by generating many proposals and keeping one, so these exceed
    `completion_tokens` many times over; they are the figures to bill or to budget by."""

    rounds: int = Field(
        description="Rounds schedule: engine calls the chains waited on (calls merge across chains and requests: a shared call counts once per chain)."
    )
    stream_batches: int = Field(description="Streaming schedule: batches of requests the chains started.")
    requests: int = Field(description="Generation requests the chains issued: every proposal, rejected and speculative (prefetched) ones included.")
    generated_tokens: int = Field(description="Tokens those requests generated, rejected and speculative proposals included.")
    prefill_tokens: int = Field(description="Prompt + prefix tokens those requests sent to the engine.")
    cached_prefill_tokens: int = Field(description="Of prefill_tokens, those the engine read from its prefix cache.")
    transitions: int = Field(description="MH steps completed.")
    accepted: int = Field(description="MH proposals accepted.")
    aborted_requests: int = Field(description="Streaming schedule: running requests aborted once the chain no longer needed them.")

    @classmethod
    def of(cls, stats: list[SampleStats]) -> "PowerSamplingUsage":
        total = SampleStats()
        for s in stats:
            total.add(s)
        return cls(
            rounds=total.rounds,
            stream_batches=total.stream_batches,
            requests=total.requests,
            generated_tokens=total.generated_tokens,
            prefill_tokens=total.prompt_tokens,
            cached_prefill_tokens=total.cached_prompt_tokens,
            transitions=total.transitions,
            accepted=total.accepted,
            aborted_requests=total.aborted_requests,
        )


class Usage(BaseModel):
    """OpenAI's usage (the prompt counted once, the returned tokens of every choice) and what
    the power sampling behind them cost."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    power_sampling: PowerSamplingUsage


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    power_sampling: RequestSeed


class ChatCompletionResponse(CompletionResponse):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]


class ProgressEvent(BaseModel):
    """A chain finished a round: how far it is (events are blocks' MH steps and extensions)."""

    event: Literal["progress"] = "progress"
    transitions: int
    rounds: int
    stream_batches: int
    events_done: int
    events_total: int


class DoneEvent(PowerSamplingStats):
    """A chain is over: its choice's stats, as the non-streamed body gives them."""

    event: Literal["done"] = "done"
    completion_tokens: int


class UsageEvent(RequestSeed):
    """The last chunk before [DONE] with stream_options.include_usage: no choices, the usage."""

    event: Literal["usage"] = "usage"


class CompletionChunkChoice(BaseModel):
    index: int
    text: str
    finish_reason: FinishReason | None
    logprobs: CompletionLogprobs | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer
    def _present_only(self) -> dict:
        # a progress chunk's delta is {}, as OpenAI sends a delta that adds nothing
        return {k: v for k, v in (("role", self.role), ("content", self.content)) if v is not None}


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    finish_reason: FinishReason | None
    logprobs: ChatLogprobs | None = None


class CompletionChunk(BaseModel):
    """One server-sent event: progress (no text) or a choice's whole text, in `power_sampling`."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChunkChoice]
    power_sampling: ProgressEvent | DoneEvent | UsageEvent
    usage: Usage | None = None  # sent (null but in the last chunk) only with stream_options.include_usage


class ChatCompletionChunk(CompletionChunk):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "presto-ray"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


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
        power_sampling=_power_sampling_stats(result.stats, seed),
        stats=result.stats,
        logprobs=token_logprobs,
    )


def _completion_logprobs(choice: SampledChoice) -> CompletionLogprobs | None:
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


def _chat_logprobs(choice: SampledChoice) -> ChatLogprobs | None:
    if choice.logprobs is None:
        return None
    content = [ChatTokenLogprob(token=t.token, logprob=t.logprob, bytes=list(t.token.encode())) for t in choice.logprobs]
    return ChatLogprobs(content=content)


def usage(prepared: Prepared, choices: list[SampledChoice]) -> Usage:
    """OpenAI's counts (the prompt once, every choice's returned tokens) and the chains' real cost."""
    prompt_tokens = len(prepared.prompt_ids)
    completion_tokens = sum(c.completion_tokens for c in choices)
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        power_sampling=PowerSamplingUsage.of([c.stats for c in choices]),
    )


def _power_sampling_stats(stats: SampleStats, seed: int) -> PowerSamplingStats:
    return PowerSamplingStats(
        seed=seed,
        rounds=stats.rounds,
        stream_batches=stats.stream_batches,
        transitions=stats.transitions,
        accepted=stats.accepted,
        acceptance_rate=stats.acceptance_rate,
        transitions_per_round=stats.transitions_per_round,
        transitions_per_stream_batch=stats.transitions_per_stream_batch,
        requests=stats.requests,
    )


def completion_response(prepared: Prepared, choices: list[SampledChoice]) -> CompletionResponse:
    """The whole answer to a request that did not ask to stream (a chat body when it was chat)."""
    fields = {
        "id": prepared.id,
        "model": prepared.model,
        "usage": usage(prepared, choices),
        "power_sampling": RequestSeed(seed=prepared.seed),
    }
    if prepared.chat:
        chat_choices = [
            ChatChoice(
                index=c.index,
                message=ChatMessageOut(content=c.text),
                finish_reason=c.finish_reason,
                power_sampling=c.power_sampling,
                logprobs=_chat_logprobs(c),
            )
            for c in choices
        ]
        return ChatCompletionResponse(choices=chat_choices, **fields)
    completion_choices = [
        CompletionChoice(
            index=c.index,
            text=c.text,
            finish_reason=c.finish_reason,
            power_sampling=c.power_sampling,
            logprobs=_completion_logprobs(c),
        )
        for c in choices
    ]
    return CompletionResponse(choices=completion_choices, **fields)


def progress_chunk(
    prepared: Prepared, index: int, stats: SampleStats, events_done: int, events_total: int
) -> CompletionChunk:
    """Choice `index`'s chain finished a round; `stats`: the chain's running counts."""
    event = ProgressEvent(
        transitions=stats.transitions, rounds=stats.rounds, stream_batches=stats.stream_batches,
        events_done=events_done, events_total=events_total,
    )
    return _chunk(prepared, index, None, None, event)


def done_chunk(prepared: Prepared, choice: SampledChoice) -> CompletionChunk:
    """A choice's whole text, once its chain is over (power samples exist only whole)."""
    event = DoneEvent(**choice.power_sampling.model_dump(), completion_tokens=choice.completion_tokens)
    return _chunk(prepared, choice.index, choice.text, choice.finish_reason, event, choice)


def usage_chunk(prepared: Prepared, choices: list[SampledChoice]) -> CompletionChunk:
    """With stream_options.include_usage, the last chunk: no choices, the whole request's usage."""
    kind = ChatCompletionChunk if prepared.chat else CompletionChunk
    event = UsageEvent(seed=prepared.seed)
    return kind(id=prepared.id, model=prepared.model, choices=[], power_sampling=event, usage=usage(prepared, choices))


def stream_end(prepared: Prepared, choices: list[SampledChoice]) -> list[str]:
    """The events that close a stream whose chains are all over: the usage chunk when it was
    asked for and every choice is there (a failed chain has no cost to report), then [DONE]."""
    events = []
    if prepared.include_usage and len(choices) == len(prepared.configs):
        events.append(sse_event(prepared, usage_chunk(prepared, sorted(choices, key=lambda c: c.index))))
    return [*events, "data: [DONE]\n\n"]


def sse_event(prepared: Prepared, body: BaseModel) -> str:
    """One server-sent event; chunks carry `usage` (null until the last) only when it was asked for."""
    exclude = None if prepared.include_usage or not isinstance(body, CompletionChunk) else {"usage"}
    return f"data: {body.model_dump_json(exclude=exclude)}\n\n"


def _chunk(
    prepared: Prepared,
    index: int,
    text: str | None,
    finish_reason: FinishReason | None,
    event: ProgressEvent | DoneEvent,
    choice: SampledChoice | None = None,
) -> CompletionChunk:
    if prepared.chat:
        delta = ChatDelta(role="assistant", content=text) if text is not None else ChatDelta()
        logprobs = _chat_logprobs(choice) if choice else None
        chunk_choice = ChatChunkChoice(index=index, delta=delta, finish_reason=finish_reason, logprobs=logprobs)
        return ChatCompletionChunk(id=prepared.id, model=prepared.model, choices=[chunk_choice], power_sampling=event)
    logprobs = _completion_logprobs(choice) if choice else None
    chunk_choice = CompletionChunkChoice(index=index, text=text or "", finish_reason=finish_reason, logprobs=logprobs)
    return CompletionChunk(id=prepared.id, model=prepared.model, choices=[chunk_choice], power_sampling=event)


def error_event(error: Exception, request_id: str | None = None) -> ErrorResponse:
    """The event a stream sends when a chain fails (the HTTP status is already 200)."""
    return internal_error(error, request_id).response()


# --- OpenAPI ---------------------------------------------------------------------------------
def openapi_route(chat: bool) -> dict:
    """The POST route's decorator arguments: its documented body is the request model, its answers
    the response models. The ingress reads and validates the body itself (401, 413 and 415 come
    before parsing, and a 400 names the field), so the schema is declared rather than inferred."""
    request = ChatRequest if chat else CompletionRequest
    chunk = ChatCompletionChunk if chat else CompletionChunk
    body = {"application/json": {"schema": _inline_refs(request.model_json_schema())}}
    ok = {
        "model": ChatCompletionResponse if chat else CompletionResponse,
        "description": "The choices; with stream: true, server-sent events, each `data:` line one chunk, then `data: [DONE]`.",
        "content": {"text/event-stream": {"schema": _inline_refs(chunk.model_json_schema(mode="serialization"))}},
    }
    errors = {
        400: "A field is invalid or cannot be honoured: `error.param` names it.",
        401: "Missing or wrong bearer token.",
        404: "Another model was named.",
        413: "The body is over serve.max_body_bytes.",
        415: "The body is not application/json.",
        500: "Not the client's fault: the message names an error id in the server log.",
    }
    responses = {200: ok, **{status: {"model": ErrorResponse, "description": d} for status, d in errors.items()}}
    return {"openapi_extra": {"requestBody": {"required": True, "content": body}}, "responses": responses}


def _inline_refs(schema: dict) -> dict:
    """A model's JSON schema with its `$defs` written in place: an operation's schema cannot point
    into a `$defs` of its own (the request models have no recursive types)."""
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if (ref := node.get("$ref", "")).startswith("#/$defs/"):
                return inline(defs[ref.removeprefix("#/$defs/")])
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return inline(schema)


def models_body(model_name: str) -> ModelList:
    """GET /v1/models: the one model this service serves."""
    return ModelList(data=[ModelCard(id=model_name)])


def stats_body(snapshot: "CoordinatorSnapshot") -> dict:
    """GET /v1/stats: the coordinator's snapshot, flattened (counters and call costs side by side)."""
    return {
        **asdict(snapshot.counters),
        **asdict(snapshot.accounting),
        "requests_per_call": snapshot.requests_per_call,
        "cached_token_share": snapshot.cached_token_share,
        "calls_per_replica": snapshot.calls_per_replica,
        "inflight_calls_per_replica": snapshot.inflight_calls_per_replica,
        "inflight_requests_per_replica": snapshot.inflight_requests_per_replica,
        "healthy": snapshot.healthy,
        "active_replicas": snapshot.active_replicas,
        "ongoing_requests": snapshot.ongoing_requests,
        "queue_depth": snapshot.queue_depth,
        "chains_active": snapshot.chains_active,
        "coordinator_shards": snapshot.shards,
        "streams_running": snapshot.streams_running,
    }
