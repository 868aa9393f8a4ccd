"""presto-ray's Ray metrics (exported to Prometheus by every Ray node's metrics agent)."""

from __future__ import annotations

from ray.util.metrics import Counter, Gauge, Histogram

_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


class CoordinatorMetrics:
    def __init__(self) -> None:
        self.calls = Counter("presto_engine_calls", "Batched engine calls.", tag_keys=("replica",))
        self.requests = Counter("presto_engine_requests", "Proposal requests sent to replicas.")
        self.requests_per_call = Histogram(
            "presto_requests_per_call", "Requests merged into one engine call.", boundaries=_SIZES
        )
        self.queue_depth = Gauge("presto_queue_depth", "Requests queued in the coordinator.")
        self.chains_active = Gauge("presto_chains_active", "Chains with work in the coordinator.")
        self.prompt_tokens = Counter("presto_prompt_tokens", "Prompt tokens of all requests.")
        self.cached_prompt_tokens = Counter("presto_cached_prompt_tokens", "Prompt tokens read from the prefix cache.")
        self.cached_token_share = Gauge("presto_cached_token_share", "Cached share of prompt tokens so far.")
        self.replica_failures = Counter("presto_replica_failures", "Calls lost to a dead replica (re-sent).")

    def record_call(self, replica: int, size: int, accounting, totals) -> None:
        """One call's `accounting`; `totals`: every call's so far."""
        self.calls.inc(1, tags={"replica": str(replica)})
        self.requests.inc(size)
        self.requests_per_call.observe(size)
        if accounting.prompt_tokens:
            self.prompt_tokens.inc(accounting.prompt_tokens)
        if accounting.cached_prompt_tokens:
            self.cached_prompt_tokens.inc(accounting.cached_prompt_tokens)
        if totals.prompt_tokens:
            self.cached_token_share.set(totals.cached_prompt_tokens / totals.prompt_tokens)


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
