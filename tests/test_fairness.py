"""Fair sharing of the engines between requests (groups of chains): calls take round robin over
requests, streaming budgets split per request first. Pure rules, the router's budgets, and the
coordinator on a real local Ray cluster."""

from __future__ import annotations


import pytest

from actors.batching import fair_competitors, fair_take, request_group
from actors.coordinator_stats import CoordinatorCounters
from actors.replica_table import ReplicaTable
from actors.stream_book import StreamBook
from presto_ray.engines.base import CallAccounting, ProposalRequest


def test_request_groups():
    assert request_group(("req-1", 3)) == "req-1"
    assert request_group("lonely") == "lonely"


def test_a_call_takes_round_robin_over_requests():
    queue = ["big"] * 100 + ["small"] * 2 + ["mid"] * 5
    chosen = fair_take(queue, 10)
    taken = [queue[i] for i in chosen]
    assert taken.count("small") == 2 and taken.count("mid") == 4 and taken.count("big") == 4
    assert chosen == sorted(chosen) and chosen[:4] == [0, 1, 2, 3], "oldest first within a request"
    assert fair_take(queue, 500) == list(range(len(queue))), "everything fits: the queue as it is"
    assert fair_take(["a"] * 5, 3) == [0, 1, 2]


def test_streaming_budgets_are_an_equal_share_per_request():
    assert fair_competitors({"a": 8, "b": 1}, "a") == 16 and fair_competitors({"a": 8, "b": 1}, "b") == 2
    table = ReplicaTable([], affinity_tokens=8, affinity_slack=0)
    router = StreamBook(table, CoordinatorCounters(), CallAccounting(), epoch="e", max_attempts=1)
    router.free_batch = 32.0  # as measured from replicas: a device that holds 32 sequences for free

    def opened(chain_id) -> int:
        router.open(chain_id, 16)
        return router.budget(chain_id)

    big = [opened(("big", i)) for i in range(8)]
    small = opened(("small", 0))
    during = router.budget(("big", 0)), router.budget(("small", 0))
    router.close(("small", 0))
    after = router.budget(("big", 0))
    assert big[0] == 16 and big[-1] == 4, "alone, 8 chains split 32: 4 each"
    assert during == (2, 16), "with a second request: 16 for each request, split among its chains"
    assert small == 16  # per chain it would have been 32 // 9 = 3
    assert after == 4 and dict(router.group_sizes) == {"big": 8}


def test_a_small_request_is_not_starved_by_a_large_one(ray_address):
    """One replica, 8 requests per call, 0.2 s per call: a chain that queued 64 requests and one
    that queued 2 at the same time. The small one is served by the first call, not the ninth."""
    pytest.importorskip("ray")
    import ray

    from actors.cluster import SamplingCluster
    from presto_ray.engines import ToyEngineConfig
    from presto_ray.ray_config import RayConfig

    settings = RayConfig(max_requests_per_call=8, batch_window_s=0.05)
    cluster = SamplingCluster(ToyEngineConfig(call_latency_s=0.2), settings)
    try:
        coordinator = cluster.coordinator

        def requests(prompt, n):
            return [ProposalRequest(prompt, (), 2, 1.0, seed=k) for k in range(n)]

        ray.get(coordinator.register_chains.remote([("big", 0), ("small", 0)]))
        big = coordinator.submit.remote(("big", 0), requests((5, 6), 64))
        # the large request queued first: the coordinator has counted its requests
        while cluster.snapshot().counters.submitted_requests < 64:
            pass
        small = coordinator.submit.remote(("small", 0), requests((7, 8), 2))
        assert len(ray.get(small, timeout=60)) == 2
        calls_when_small_done = cluster.snapshot().accounting.calls
        assert len(ray.get(big, timeout=60)) == 64
        assert calls_when_small_done <= 2, calls_when_small_done  # FIFO would have taken 9 calls
        assert cluster.snapshot().accounting.calls == 9  # 66 requests, 8 per call
    finally:
        cluster.shutdown()
