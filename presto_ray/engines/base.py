"""The engine contract shared by the toy engine and vLLM: requests, completions, what calls cost,
and the two forms of an engine: `Engine` (batched calls: rounds and the serial chain) and
`StreamingEngine` (per-request streams: the streaming schedule, docs/streaming.md)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from presto_ray.early_rejection import RejectionBound

# "rejected": stopped by exact early rejection, every bound the request carries rejects its tokens
FinishReason = Literal["stop", "length", "rejected"]


@dataclass(frozen=True)
class ProposalRequest:
    """Sample up to `max_new_tokens` tokens from q_tau after prompt + prefix.

    `temperature` 0 means greedy decoding (argmax of p0; `presto-ray eval` uses it, no MH kernel
    does): log q of a greedy token is 0 on the toy and whatever the engine reports on vLLM.

    The completion must be a deterministic function of (seed, prompt, prefix, max_new_tokens,
    temperature, stop_at_eos): that is what lets one request serve every tree node that needs it.

    `rejection_bounds` (exact early rejection, docs/samplers.md): one bound per plan node that
    would use this request. An engine may stop the request once every bound rejects its tokens so
    far (`early_rejection.RequestStop`), ending it with finish reason "rejected"; a stopped
    completion is a prefix of the full one. An engine that ignores them stays correct.
    """

    prompt_token_ids: tuple[int, ...]
    prefix_token_ids: tuple[int, ...]
    max_new_tokens: int
    temperature: float
    seed: int
    stop_at_eos: bool = True
    want_entropy: bool = False  # also return the entropy of p0 at each generated position
    rejection_bounds: tuple[RejectionBound, ...] = ()

    @property
    def context_token_ids(self) -> tuple[int, ...]:
        return self.prompt_token_ids + self.prefix_token_ids


@dataclass(frozen=True, eq=False)
class Completion:
    """Sampled tokens with their exact per-token log p0 and log q_tau (EOS included).

    Equal when every field is: the arrays by value (`np.array_equal`), so a completion equals its
    copy after pickling (over Ray) and the events that carry one compare as values. Not hashable:
    its arrays are mutable."""

    token_ids: tuple[int, ...]
    logp0: np.ndarray
    logq: np.ndarray
    finish_reason: FinishReason
    cached_prompt_tokens: int = 0  # prompt tokens this request read from the prefix cache
    entropy: np.ndarray | None = None  # entropy of p0 at each position, when requested

    def __post_init__(self) -> None:
        if not (len(self.token_ids) == len(self.logp0) == len(self.logq)):
            raise ValueError("token_ids, logp0 and logq must have the same length")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Completion):
            return NotImplemented
        return (
            self.token_ids == other.token_ids
            and self.finish_reason == other.finish_reason
            and self.cached_prompt_tokens == other.cached_prompt_tokens
            and np.array_equal(self.logp0, other.logp0)
            and np.array_equal(self.logq, other.logq)
            and (
                self.entropy is other.entropy
                or (self.entropy is not None and other.entropy is not None and np.array_equal(self.entropy, other.entropy))
            )
        )

    @property
    def stopped_early(self) -> bool:
        """Stopped by early rejection: the proposal's first tokens only, enough to reject."""
        return self.finish_reason == "rejected"

    def truncated(self, length: int) -> Completion:
        """The first `length` tokens, stopped by early rejection."""
        entropy = None if self.entropy is None else self.entropy[:length]
        return Completion(
            self.token_ids[:length], self.logp0[:length], self.logq[:length], "rejected", self.cached_prompt_tokens, entropy
        )


@dataclass
class CallAccounting:
    """What one batched call cost, as the engine measured it."""

    calls: int = 0
    num_requests: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    scoring_tokens: int = 0  # tokens prefilled again to score log p0 (engines that need it)
    scoring_time_s: float = 0.0
    wall_time_s: float = 0.0

    def add(self, other: CallAccounting) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def minus(self, earlier: CallAccounting) -> CallAccounting:
        """What was spent since `earlier` (a streaming engine's running totals between two polls)."""
        return CallAccounting(**{f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)})


@dataclass
class EngineOutput:
    completions: list[Completion]
    accounting: CallAccounting = field(default_factory=CallAccounting)


class Tokenizer(Protocol):
    """Text and chat messages to token ids and back, as the engine's model sees them."""

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]:
        """A plain-text prompt, wrapped in the chat template where the engine is configured to."""
        ...

    def encode_raw(self, text: str) -> list[int]:
        """The text as it is, never wrapped in a chat template (the completions API)."""
        ...

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]]) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class EngineEvent:
    """A streamed request ended (`completion` or `error` set) or reached `generated` tokens that the
    chain waits for (a fork point: neither set, the request runs on)."""

    handle: int
    generated: int
    completion: Completion | None = None
    error: BaseException | None = None  # the engine refused or lost the request

    @property
    def ended(self) -> bool:
        return self.completion is not None or self.error is not None

    @property
    def reason(self) -> str | None:
        """The error as a chain reports it (`ValueError: ...`), None without one."""
        return None if self.error is None else f"{type(self.error).__name__}: {self.error}"


class StreamingEngine(Protocol):
    """Per-request submission with completion events, partial tokens at fork points, abort and
    priority (lower runs first). Handles are the engine's own; events name them."""

    @property
    def busy(self) -> bool:
        """Requests are running or waiting, or events are not collected yet."""
        ...

    @property
    def free_batch(self) -> float:
        """Sequences the device runs before speculation stops paying (inf: unlimited), shared by
        the chains (presto_ray/speculation.py)."""
        ...

    def submit(self, request: ProposalRequest, priority: float = 0.0) -> int:
        """Start `request`; its handle. Raises ValueError for a request the engine cannot serve."""
        ...

    def wake_at(self, handle: int, generated: int) -> None:
        """Raise an event once `handle` has `generated` tokens (at once if it has them)."""
        ...

    def partial_tokens(self, handle: int) -> tuple[int, ...]:
        """The tokens `handle` has generated so far (final: a proposal never rewrites them)."""
        ...

    def abort(self, handle: int) -> None:
        """Stop `handle` and free its slot; no event follows. Unknown or ended handles are ignored."""
        ...

    def set_rejection_bounds(self, handle: int, bounds: Sequence[RejectionBound]) -> None:
        """Replace `handle`'s early-rejection bounds (ProposalRequest.rejection_bounds): it ends as
        "rejected" once all of these reject its tokens, at once (an event) if they reject the tokens
        it has; empty bounds: it runs to its end. Unknown or ended handles are ignored."""
        ...

    def advance(self) -> Sequence[EngineEvent]:
        """Block until something happens: the events since, of requests still live (an engine that
        loses a request raises its error)."""
        ...

    async def next_events(self, timeout_s: float) -> Sequence[EngineEvent]:
        """`advance` for an event loop (an engine replica): waits at most `timeout_s`, reports
        errors as events."""
        ...

    def accounting(self) -> CallAccounting:
        """Running totals since the streaming form was made: requests submitted, their prompt and
        cached tokens, tokens decoded (aborted requests' included) and scored."""
        ...


@runtime_checkable
class Engine(Protocol):
    """Anything that turns a batch of proposal requests into completions in one call, and has a
    per-request form for the streaming schedule.

    Both engines (the toy and vLLM) implement all of it, so drivers, replicas and the service
    never ask which engine they hold.
    """

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def model_name(self) -> str:
        """The id clients name (`/v1/models`)."""
        ...

    @property
    def context_length(self) -> int:
        """Longest prompt + prefix + generation a request may reach."""
        ...

    @property
    def free_batch(self) -> float:
        """Sequences the device runs before speculation stops paying (inf: unlimited): the active
        chains of a round share it (presto_ray/speculation.py), as streaming's do its form's."""
        ...

    def generate(self, requests: Sequence[ProposalRequest]) -> EngineOutput:
        """One batched call, blocking."""
        ...

    async def agenerate(self, requests: Sequence[ProposalRequest]) -> EngineOutput:
        """The same call, awaitable from any event loop (Ray actors)."""
        ...

    def shutdown(self) -> None:
        """Free the engine's processes and memory; idempotent."""
        ...

    def streaming(self) -> StreamingEngine:
        """This engine's per-request form for the streaming schedule."""
        ...
