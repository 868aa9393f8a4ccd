"""presto-ray's Ray metrics (exported to Prometheus by every Ray node's metrics agent).

One object per kind of figure: what engines did (`EngineCostMetrics`, fed by the replicas'
CallAccounting under both schedules: a call's, or a stream poll's since the last one), batched calls
(`CallMetrics`, rounds), streams (`StreamMetrics`: starts, dedups, wakes, aborts), the
coordinator's own state (`CoordinatorMetrics`, which holds the others) and chains (`ChainMetrics`).
"""

from __future__ import annotations

from ray.util.metrics import Counter, Gauge, Histogram

from presto_ray.engines.base import CallAccounting

_SIZES: list[float] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


class EngineCostMetrics:
    """What the replicas measured, whichever schedule: requests served and tokens."""

    def __init__(self) -> None:
        self.requests = Counter("presto_engine_requests", "Proposal requests served by replicas.")
        self.prompt_tokens = Counter("presto_prompt_tokens", "Prompt tokens of all requests.")
        self.cached_prompt_tokens = Counter("presto_cached_prompt_tokens", "Prompt tokens read from the prefix cache.")
        self.generated_tokens = Counter("presto_generated_tokens", "Tokens decoded by replicas (aborted ones too).")
        self.cached_token_share = Gauge("presto_cached_token_share", "Cached share of prompt tokens so far.")

    def record(self, cost: CallAccounting, totals: CallAccounting) -> None:
        """`cost` since the last record; `totals`: everything so far."""
        for counter, value in (
            (self.requests, cost.num_requests),
            (self.prompt_tokens, cost.prompt_tokens),
            (self.cached_prompt_tokens, cost.cached_prompt_tokens),
            (self.generated_tokens, cost.generated_tokens),
        ):
            if value:
                counter.inc(value)
        if totals.prompt_tokens:
            self.cached_token_share.set(totals.cached_prompt_tokens / totals.prompt_tokens)


class CallMetrics:
    """Batched engine calls (the rounds schedule)."""

    def __init__(self) -> None:
        self.calls = Counter("presto_engine_calls", "Batched engine calls.", tag_keys=("replica",))
        self.requests_per_call = Histogram(
            "presto_requests_per_call", "Requests merged into one engine call.", boundaries=_SIZES
        )

    def record(self, replica: int, size: int) -> None:
        self.calls.inc(1, tags={"replica": str(replica)})
        self.requests_per_call.observe(size)


class StreamMetrics:
    """Per-request streams (the streaming schedule), as the coordinator sees them; forks themselves
    are counted by the chains (SampleStats)."""

    def __init__(self) -> None:
        self.starts = Counter("presto_stream_starts", "Streams started on replicas (re-sends included).")
        self.wakes = Counter("presto_stream_wakes", "Fork points asked of replicas.")
        self.aborts = Counter("presto_stream_aborts", "Streams aborted on replicas (no chain wanted them).")

    def record_starts(self, n: int) -> None:
        if n:
            self.starts.inc(n)

    def record_wakes(self, n: int) -> None:
        if n:
            self.wakes.inc(n)

    def record_aborts(self, n: int) -> None:
        if n:
            self.aborts.inc(n)


class CoordinatorMetrics:
    """Everything one coordinator exports."""

    def __init__(self) -> None:
        self.engine = EngineCostMetrics()
        self.calls = CallMetrics()
        self.streams = StreamMetrics()
        self.deduplicated = Counter("presto_deduplicated_requests", "Requests served by an identical one (either schedule).")
        self.queue_depth = Gauge("presto_queue_depth", "Requests queued in the coordinator.")
        self.chains_active = Gauge("presto_chains_active", "Chains with work in the coordinator.")
        self.streams_running = Gauge("presto_streams_running", "Streams running on replicas.")
        self.replica_failures = Counter("presto_replica_failures", "Calls or streams lost to a dead replica (re-sent).")

    def record_call(self, replica: int, size: int, cost: CallAccounting, totals: CallAccounting) -> None:
        """One call of `size` requests on `replica`; `totals`: every cost so far."""
        self.calls.record(replica, size)
        self.engine.record(cost, totals)

    def record_deduplicated(self, n: int) -> None:
        if n:
            self.deduplicated.inc(n)


class ChainMetrics:
    """Recorded where chains run (stage actors, Serve replicas): transitions per call is
    rate(presto_transitions) / rate(presto_engine_calls) in Prometheus."""

    def __init__(self) -> None:
        self.transitions = Counter("presto_transitions", "MH steps completed by all chains.")
        self.rounds = Counter("presto_chain_rounds", "Rounds (calls waited on) summed over chains.")

    def record_round(self, transitions: int) -> None:
        self.rounds.inc(1)
        if transitions:
            self.transitions.inc(transitions)
