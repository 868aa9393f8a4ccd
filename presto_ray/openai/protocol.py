"""The JSON of the HTTP API, declared once: request models (also the OpenAPI schema of the routes),
every response body and chunk, and the `/v1/stats` body. Models only: the rules that need more
than a field's type and bounds are body.py's and prepare.py's; filling the bodies is the renderers'."""

from __future__ import annotations

import time
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer
from pydantic.fields import FieldInfo

from presto_ray.config import MAX_ALPHA, SamplerConfig, SamplerKind, Traversal
from presto_ray.engines.base import FinishReason
from presto_ray.prompts import ChatRole

MIN_TEMPERATURE = 1.0 / MAX_ALPHA  # temperature t means alpha = 1/t


# --- requests --------------------------------------------------------------------------------
def _power_field(name: str, service_limit: str = "") -> Any:
    """A request field that sets SamplerConfig's `name`: its limits and description are the
    sampler's own, so the OpenAPI schema shows the same bounds the chain enforces (the field's
    type is written beside it; a test checks it is the sampler's, made optional)."""
    info = SamplerConfig.model_fields[name]
    field = FieldInfo.from_field(None, description=f"Power sampling: {info.description}{service_limit}")
    field.metadata = list(info.metadata)  # applied to the non-null arm, as the sampler applies them
    return field


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool | None = Field(
        None, description="Send a last chunk (empty `choices`) with the request's `usage`; every other chunk has `usage: null`."
    )


class _Request(BaseModel):
    # strict: "3" is not a number and 1 is not a bool; finite: Infinity, NaN and 1e400 are refused;
    # unknown fields are checked by hand (to name them, and to let neutral values of unsupported ones pass)
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)
    id_prefix: ClassVar[str]  # of the response id: "cmpl-..." or "chatcmpl-..."

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
    alpha: float | None = _power_field("alpha")
    mh_steps: int | None = _power_field("mh_steps", " The service allows at most serve.max_mh_steps (1000 by default).")
    block_size: int | None = _power_field("block_size", " It must divide max_tokens.")
    prefetch_budget: int | None = _power_field(
        "prefetch_budget", " The service allows at most serve.max_prefetch_budget (256 by default)."
    )
    traversal: Traversal | None = _power_field("traversal")
    sampler: SamplerKind | None = _power_field("sampler")

    def wants_logprobs(self) -> bool:
        return False


POWER_FIELDS = ("alpha", "mh_steps", "block_size", "prefetch_budget", "traversal", "sampler")


class CompletionRequest(_Request):
    """POST /v1/completions. Any other OpenAI field is refused with a 400 naming it, unless it has
    its neutral value (`best_of: 1`, `echo: false`, `stop: []`, `top_k: -1`, ...)."""

    id_prefix: ClassVar[str] = "cmpl"

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
    # unknown keys (a typo such as `contnet`, or `name`, `tool_calls` this API cannot honour) are a
    # 400 naming them, as at the top level
    model_config = ConfigDict(extra="forbid", strict=True)
    role: ChatRole
    content: str


class ChatRequest(_Request):
    """POST /v1/chat/completions. Any other OpenAI field is refused with a 400 naming it, unless it
    has its neutral value (`tools: []`, `response_format: {"type": "text"}`, ...)."""

    id_prefix: ClassVar[str] = "chatcmpl"

    messages: list[ChatMessage] = Field(min_length=1, description="Through the model's chat template.")
    max_completion_tokens: int | None = Field(
        None, ge=1, description="OpenAI's current name for max_tokens in chat: the same horizon (send one, or both equal)."
    )
    logprobs: bool | None = Field(None, description="true: each returned token's log p0 (the base model's).")
    top_logprobs: int | None = Field(
        None, ge=0, json_schema_extra={"maximum": 0}, description="Only 0: a power sample has no per-token top alternatives."
    )

    def wants_logprobs(self) -> bool:
        return bool(self.logprobs)


# --- the chains' figures (filled from SampleStats by figures.py, the one mapping) -------------
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
    early_stopped_requests: int = Field(
        description="Exact early rejection: requests the engine stopped once their rejection was certain (the samples are the same either way)."
    )
    early_stop_tokens_left: int = Field(
        description="The max_new_tokens those requests left unused: the tokens not generated with fixed length, at most that with EOS."
    )


class ProgressEvent(BaseModel):
    """A chain finished a round: how far it is (events are blocks' MH steps and extensions)."""

    event: Literal["progress"] = "progress"
    transitions: int
    rounds: int
    stream_batches: int
    events_done: int
    events_total: int


# --- response bodies -------------------------------------------------------------------------
def _now() -> int:
    return int(time.time())


class RequestSeed(BaseModel):
    """The top-level `power_sampling`: the request's seed, given or drawn."""

    seed: int


class Usage(BaseModel):
    """OpenAI's usage (the prompt counted once, the returned tokens of every choice) and what
    the power sampling behind them cost."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    power_sampling: PowerSamplingUsage


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


# The two APIs' bodies share their fields, declared in each (not inherited: `object` and `choices`
# differ in type, and the keys keep OpenAI's order).
class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    power_sampling: RequestSeed


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChoice]
    usage: Usage
    power_sampling: RequestSeed


# --- server-sent events ----------------------------------------------------------------------
class DoneEvent(PowerSamplingStats):
    """A chain is over: its choice's stats, as the non-streamed body gives them."""

    event: Literal["done"] = "done"
    completion_tokens: int


class UsageEvent(RequestSeed):
    """The last chunk before [DONE] with stream_options.include_usage: no choices, the usage."""

    event: Literal["usage"] = "usage"


ChunkEvent = ProgressEvent | DoneEvent | UsageEvent


class CompletionChunkChoice(BaseModel):
    index: int
    text: str
    finish_reason: FinishReason | None
    logprobs: CompletionLogprobs | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer
    def _present_only(self) -> dict[str, Any]:  # dict[str, Any]: the schema says any properties
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


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChunkChoice]
    power_sampling: ProgressEvent | DoneEvent | UsageEvent
    usage: Usage | None = None


Response = CompletionResponse | ChatCompletionResponse
Chunk = CompletionChunk | ChatCompletionChunk


# --- the other routes ------------------------------------------------------------------------
class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "presto-ray"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def models_body(model_name: str) -> ModelList:
    """GET /v1/models: the one model this service serves."""
    return ModelList(data=[ModelCard(id=model_name)])


class StatsResponse(BaseModel):
    """GET /v1/stats: the coordinator's figures at one moment, flat (summed over its shards).
    Built from the Ray layer's snapshot by deployments/serve_stats.py; the library never sees it."""

    model_config = ConfigDict(extra="forbid")

    # what the coordinator counts
    submitted_requests: int = Field(description="Proposal requests chains asked for.")
    deduplicated: int = Field(description="Of those, requests served by another chain's identical request.")
    chains_finished: int
    chains_abandoned: int = Field(description="Of chains_finished, chains whose client left mid-call.")
    chains_expired: int = Field(description="Chains silent past chain_idle_timeout_s, no longer waited for.")
    replica_failures: int = Field(description="Calls lost to a dead engine replica (their requests were re-sent).")
    resent_requests: int
    max_queue_depth: int
    max_requests_per_call: int
    affinity_misses: int = Field(description="Requests sent away from their prompt's preferred replica.")
    streamed_requests: int = Field(description="Streaming schedule: requests sent to replicas one by one (after dedup).")
    stream_aborts: int = Field(description="Streaming schedule: requests aborted on their replica.")
    # what the engine calls cost, as the replicas measured it (retries included)
    calls: int
    num_requests: int = Field(description="Requests in those calls.")
    prompt_tokens: int = Field(description="Prefill tokens of those requests (usage's prefill_tokens, summed over the service).")
    cached_prompt_tokens: int
    generated_tokens: int
    scoring_tokens: int = Field(description="Tokens prefilled again to score log p0 (engines that need it).")
    scoring_time_s: float
    wall_time_s: float = Field(description="The calls' wall time, summed over calls.")
    # derived, and the state at this moment
    requests_per_call: float
    cached_token_share: float = Field(description="cached_prompt_tokens / prompt_tokens.")
    calls_per_replica: list[int]
    inflight_calls_per_replica: list[int]
    inflight_requests_per_replica: list[int]
    healthy: list[bool]
    active_replicas: int = Field(description="Engine replicas taking new work (not retiring).")
    ongoing_requests: int = Field(description="Proposal requests the engines owe: queued, in a call or streaming.")
    queue_depth: int
    chains_active: int
    coordinator_shards: int
    streams_running: int = Field(description="Streaming schedule: requests running on replicas.")
    # what the HTTP ingress counts
    client_disconnects: int = Field(
        0, description="Requests whose client went away before the answer or the stream ended (every ingress replica's)."
    )
    # what the sampling pool knows
    pending_replicas: int = Field(
        0, description="Engine replicas the autoscaler asked for that have not started yet (no node can hold them "
        "yet, or their engine is starting); they take work once started."
    )
