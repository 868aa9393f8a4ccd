"""GET /v1/stats from the coordinator's snapshot: the Ray layer's CoordinatorSnapshot
(actors/coordinator_stats.py) into the library's typed body (presto_ray/openai/protocol.py's
StatsResponse). Named field by field: a figure the coordinator adds reaches clients only once the
body declares it."""

from __future__ import annotations

from actors.coordinator_stats import CoordinatorSnapshot
from presto_ray.openai.protocol import StatsResponse


def stats_response(snapshot: CoordinatorSnapshot, client_disconnects: int = 0, pending_replicas: int = 0) -> StatsResponse:
    """`client_disconnects`: the ingress's count (the sampling pool sums every replica's);
    `pending_replicas`: the pool's replicas asked for and not started."""
    counters, accounting = snapshot.counters, snapshot.accounting
    return StatsResponse(
        submitted_requests=counters.submitted_requests,
        deduplicated=counters.deduplicated,
        chains_finished=counters.chains_finished,
        chains_abandoned=counters.chains_abandoned,
        chains_expired=counters.chains_expired,
        replica_failures=counters.replica_failures,
        resent_requests=counters.resent_requests,
        max_queue_depth=counters.max_queue_depth,
        max_requests_per_call=counters.max_requests_per_call,
        affinity_misses=counters.affinity_misses,
        streamed_requests=counters.streamed_requests,
        stream_aborts=counters.stream_aborts,
        calls=accounting.calls,
        num_requests=accounting.num_requests,
        prompt_tokens=accounting.prompt_tokens,
        cached_prompt_tokens=accounting.cached_prompt_tokens,
        generated_tokens=accounting.generated_tokens,
        scoring_tokens=accounting.scoring_tokens,
        scoring_time_s=accounting.scoring_time_s,
        wall_time_s=accounting.wall_time_s,
        requests_per_call=snapshot.requests_per_call,
        cached_token_share=snapshot.cached_token_share,
        calls_per_replica=snapshot.calls_per_replica,
        inflight_calls_per_replica=snapshot.inflight_calls_per_replica,
        inflight_requests_per_replica=snapshot.inflight_requests_per_replica,
        healthy=snapshot.healthy,
        active_replicas=snapshot.active_replicas,
        ongoing_requests=snapshot.ongoing_requests,
        queue_depth=snapshot.queue_depth,
        chains_active=snapshot.chains_active,
        coordinator_shards=snapshot.shards,
        streams_running=snapshot.streams_running,
        client_disconnects=client_disconnects,
        pending_replicas=pending_replicas,
    )
