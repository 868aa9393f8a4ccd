"""What a sample returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class SampleStats:
    model_calls: int  # batched engine calls (rounds)
    transitions: int  # MH steps completed
    accepted: int
    requests: int  # proposal requests issued
    requests_used: int  # requests the walk consumed
    generated_tokens: int  # tokens generated across all requests
    extensions: int
    certain_edges: int
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    engine_time_s: float = 0.0
    wall_time_s: float = 0.0

    @property
    def transitions_per_call(self) -> float:
        return self.transitions / self.model_calls if self.model_calls else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.transitions if self.transitions else 0.0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SampleResult:
    token_ids: tuple[int, ...]  # generated tokens only, ending with EOS when the chain stopped there
    stats: SampleStats
