"""What a chain reports: its sample and one set of statistics, counted by the chain itself."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class SampleStats:
    """What one chain did and what its requests cost, as the chain saw it.

    The chain counts everything but `wall_time_s`, which its driver measures. A job sums these
    over chains; what engine calls cost in total (calls are shared by chains) is a CallAccounting.
    """

    rounds: int = 0  # rounds schedule: engine calls this chain waited on (a call merged across chains counts once per chain)
    stream_batches: int = 0  # streaming schedule: batches of requests the chain started (one per streaming step that started any)
    transitions: int = 0  # MH steps completed
    accepted: int = 0
    extensions: int = 0  # block extensions that needed a request
    requests: int = 0  # distinct proposal requests issued
    requests_used: int = 0  # requests whose completion the walk consumed
    aborted_requests: int = 0  # streaming: running requests the walk made useless (aborted)
    forked_requests: int = 0  # streaming: requests started from a proposal still being generated
    generated_tokens: int = 0  # tokens generated across all issued requests
    early_stopped_requests: int = 0  # early rejection: requests the engine stopped once rejection was certain
    early_stop_tokens_left: int = 0  # their unused max_new_tokens: the tokens not generated at fixed length, at most that with EOS
    early_rejected_steps: int = 0  # MH steps rejected from a stopped proposal's first tokens
    early_stop_rerequests: int = 0  # stopped requests the walked node could not use, asked again without bounds
    certain_edges: int = 0  # MH edges with A <= eps or A >= 1 - eps
    prompt_tokens: int = 0  # prompt + prefix tokens of every issued request
    cached_prompt_tokens: int = 0  # of which the engine read from its prefix cache
    wall_time_s: float = 0.0  # from the chain's start to its end, as its driver measured

    @property
    def transitions_per_round(self) -> float:
        """Rounds schedule: MH steps per engine call waited on (0 under streaming)."""
        return self.transitions / self.rounds if self.rounds else 0.0

    @property
    def transitions_per_stream_batch(self) -> float:
        """Streaming schedule: MH steps per batch of requests started (0 under rounds)."""
        return self.transitions / self.stream_batches if self.stream_batches else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.transitions if self.transitions else 0.0

    def add(self, other: "SampleStats") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class SampleResult:
    token_ids: tuple[int, ...]  # generated tokens only, ending with EOS when the chain stopped there
    stats: SampleStats
    logp0: tuple[float, ...] = ()  # log p0 of each token in token_ids (what `presto-ray validate` tests)
