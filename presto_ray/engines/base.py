"""The engine protocol shared by the toy engine and vLLM."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class ProposalRequest:
    """Sample up to `max_new_tokens` tokens from q_tau after prompt + prefix.

    `temperature` 0 means greedy decoding (argmax of p0; `presto-ray eval` uses it, no MH kernel
    does): log q of a greedy token is 0 on the toy and whatever the engine reports on vLLM.

    The completion must be a deterministic function of (seed, prompt, prefix, max_new_tokens,
    temperature, stop_at_eos): that is what lets one request serve every tree node that needs it.
    """

    prompt_token_ids: tuple[int, ...]
    prefix_token_ids: tuple[int, ...]
    max_new_tokens: int
    temperature: float
    seed: int
    stop_at_eos: bool = True
    want_entropy: bool = False  # also return the entropy of p0 at each generated position

    @property
    def context_token_ids(self) -> tuple[int, ...]:
        return self.prompt_token_ids + self.prefix_token_ids


@dataclass(frozen=True)
class Completion:
    """Sampled tokens with their exact per-token log p0 and log q_tau (EOS included)."""

    token_ids: tuple[int, ...]
    logp0: np.ndarray
    logq: np.ndarray
    finish_reason: FinishReason
    cached_prompt_tokens: int = 0  # prompt tokens this request read from the prefix cache
    entropy: np.ndarray | None = None  # entropy of p0 at each position, when requested

    def __post_init__(self) -> None:
        if not (len(self.token_ids) == len(self.logp0) == len(self.logq)):
            raise ValueError("token_ids, logp0 and logq must have the same length")


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

    def add(self, other: "CallAccounting") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class EngineOutput:
    completions: list[Completion]
    accounting: CallAccounting = field(default_factory=CallAccounting)


class Tokenizer(Protocol):
    """Text and chat messages to token ids and back, as the engine's model sees them."""

    eos_token_id: int | None
    vocab_size: int

    def encode(self, text: str) -> list[int]:
        """A plain-text prompt, wrapped in the chat template where the engine is configured to."""
        ...

    def encode_raw(self, text: str) -> list[int]:
        """The text as it is, never wrapped in a chat template (the completions API)."""
        ...

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]]) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...


@runtime_checkable
class Engine(Protocol):
    """Anything that turns a batch of proposal requests into completions in one call.

    Both engines (the toy and vLLM) implement all of it, so drivers, replicas and the service
    never ask which engine they hold.
    """

    tokenizer: Tokenizer
    eos_token_id: int | None
    model_name: str  # the id clients name (`/v1/models`)
    context_length: int  # longest prompt + prefix + generation a request may reach

    def generate(self, requests: Sequence[ProposalRequest]) -> EngineOutput:
        """One batched call, blocking."""
        ...

    async def agenerate(self, requests: Sequence[ProposalRequest]) -> EngineOutput:
        """The same call, awaitable from any event loop (Ray actors)."""
        ...

    def shutdown(self) -> None:
        """Free the engine's processes and memory; idempotent."""
        ...

    def streaming(self):
        """This engine's per-request form for the streaming schedule (presto_ray.streaming's
        StreamingEngine: submit, completion events, partial tokens at fork points, abort, priority)."""
        ...
