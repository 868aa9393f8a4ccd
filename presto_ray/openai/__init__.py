"""The HTTP contract of the service: the OpenAI completions and chat APIs with power sampling.

Pure functions and pydantic models, no Ray and no HTTP server, so every rule is unit-testable;
deployments/serve_app.py only moves bytes: it calls `prepare`, runs the chains it describes, and
sends the bodies built here. One module per concern:

  errors.py       error bodies, ApiError, the 500 without internals, the bearer token, the content type
  protocol.py     the JSON: request models (the OpenAPI schema too), response bodies, chunks, /v1/stats
  body.py         a body as the request model: strict JSON, field paths, unsupported fields, limits
  prepare.py      a body to its chains: model check, sampler config, prompt rules, seeds
  work_bounds.py  the work a request may ask: blocks, token-steps, its bound on generated tokens
  figures.py      SampleStats under its HTTP names: the one mapping, for choices, usage and progress
  choices.py      one chain's answer (text, finish reason, figures, log p0) and the request's usage
  completions.py  the completions API's bodies and chunks;  chat.py: the chat API's
  render.py       picks a request's renderer; whole bodies, server-sent events, the end of a stream
  openapi.py      the POST routes' OpenAPI description

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
    (`check_api_key`), the content type and charset (`check_content_type`) and coding
    (`check_content_encoding`: identity only; `check_transfer_encoding`: chunked only), the headers' bounds and
    the ones that must come once (`check_headers`), a client's request id (`safe_request_id`),
    routing errors in OpenAI's shape (`http_error`), a client that leaves (`client_disconnected`:
    one log line, no traceback), and the body of a 500, which never
    carries internals (`internal_error`: the details go to the server log under an error id).
"""

from presto_ray.openai.choices import SampledChoice, TokenLogprob, choice_from_result, request_usage
from presto_ray.openai.errors import (
    ApiError,
    ErrorResponse,
    check_api_key,
    check_content_encoding,
    check_content_type,
    check_headers,
    check_transfer_encoding,
    client_disconnected,
    error_event,
    http_error,
    internal_error,
    safe_request_id,
)
from presto_ray.openai.figures import HTTP_FIGURES, choice_figures, progress_event, usage_figures
from presto_ray.openai.openapi import openapi_route
from presto_ray.openai.prepare import Prepared, prepare
from presto_ray.openai.protocol import (
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatMessage,
    ChatRequest,
    CompletionChunk,
    CompletionRequest,
    CompletionResponse,
    ModelList,
    PowerSamplingStats,
    PowerSamplingUsage,
    ProgressEvent,
    StatsResponse,
    Usage,
    models_body,
)
from presto_ray.openai.render import completion_response, done_chunk, progress_chunk, sse_event, stream_end, usage_chunk

__all__ = [
    "HTTP_FIGURES", "ApiError", "ChatCompletionChunk", "ChatCompletionResponse", "ChatMessage", "ChatRequest",
    "CompletionChunk", "CompletionRequest", "CompletionResponse", "ErrorResponse", "ModelList", "PowerSamplingStats",
    "PowerSamplingUsage", "Prepared", "ProgressEvent", "SampledChoice", "StatsResponse", "TokenLogprob", "Usage",
    "check_api_key", "check_content_encoding", "check_content_type", "check_headers", "check_transfer_encoding", "choice_figures", "client_disconnected", "http_error",
    "safe_request_id", "choice_from_result", "completion_response", "done_chunk",
    "error_event", "internal_error", "models_body", "openapi_route", "prepare", "progress_chunk", "progress_event",
    "request_usage", "sse_event", "stream_end", "usage_chunk", "usage_figures",
]  # fmt: skip
