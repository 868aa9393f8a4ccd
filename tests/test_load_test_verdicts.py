"""bench/load_test.py's verdicts and bench/load_clients.py's request mixes as pure functions (no
service, no Ray): each check can fail. The load test itself on a real service: tests/test_serve.py."""

from __future__ import annotations

from bench.load_clients import BAD_REQUESTS, MIX, BadRequest, GoodRequest, soak_mix, timed_mix
from bench.load_test import memory_verdict, verdict


def test_the_memory_verdict_compares_the_same_processes():
    """A process that was not alive at the first pass's end (an actor that came alive late, a
    restarted replica) is named and fails the verdict; it is not read as the others' growth."""
    first = {"pass": 1, "service_rss_mb": 2000.0, "processes": {"1": ["ingress", 1000.0], "2": ["Coordinator", 1000.0]}}
    same = {"pass": 2, "service_rss_mb": 2100.0, "processes": {"1": ["ingress", 1050.0], "2": ["Coordinator", 1050.0]}}
    assert memory_verdict([first, same]) | {"flat": True, "growth_mb": 100.0, "allowed_growth_mb": 200.0} == memory_verdict([first, same])
    late = {**same, "service_rss_mb": 2350.0, "processes": {**same["processes"], "3": ["Coordinator", 250.0]}}
    late_verdict = memory_verdict([first, late])
    assert late_verdict["growth_mb"] == 100.0 and late_verdict["started"] == {"3": ["Coordinator", 250.0]} and not late_verdict["flat"]
    grown = {**same, "processes": {"1": ["ingress", 1000.0], "2": ["Coordinator", 1201.0]}}
    assert not memory_verdict([first, grown])["flat"]  # 201 MiB over 2,000: past the 10%
    # rows without processes (older reports): the sums, as before
    assert not memory_verdict([{"pass": 1, "service_rss_mb": 2000.0}, {"pass": 2, "service_rss_mb": 2201.0}])["flat"]


def row(**changes) -> dict:
    return {"pass": 1, "errors": 0, "lost_or_duplicated": 0, "went_idle": True, "chains_expired": 0, "service_rss_mb": 100.0} | changes


def test_work_is_cancelled_only_when_every_round_went_idle_and_no_chain_expired():
    assert verdict([row(), row(**{"pass": 2})])["work_cancelled"]
    assert not verdict([row(), row(**{"pass": 2, "went_idle": False})])["work_cancelled"]  # still busy after the timeout
    assert not verdict([row(chains_expired=1), row(**{"pass": 2})])["work_cancelled"]  # ended by the silence timeout
    assert not verdict([row(errors=1)])["no_errors"] and not verdict([row(lost_or_duplicated=1)])["nothing_lost_or_duplicated"]


def test_the_timed_mix_gives_each_client_its_own_walk_through_the_mix():
    next_request = timed_mix(60.0, first_seed=7)
    first_of_client_3 = [next_request(3) for _ in range(len(MIX) + 1)]
    assert first_of_client_3[0] == GoodRequest(*MIX[3], 7 + 300_000)
    assert [r.seed for r in first_of_client_3 if r] == [7 + 300_000 + i for i in range(len(MIX) + 1)]
    assert next_request(0) == GoodRequest(*MIX[0], 7)  # client 0's first, after client 3's
    assert timed_mix(0.0, 1)(0) is None  # past its time: the client stops


def test_the_soak_mix_shares_its_requests_and_mixes_in_bad_ones():
    next_request = soak_mix(7)
    sent = [next_request(i % 2) for i in range(9)]
    assert sent[7:] == [None, None]
    assert sent[2] == BAD_REQUESTS[0] and sent[5] == BAD_REQUESTS[1] and isinstance(sent[2], BadRequest)
    assert [r.seed for r in sent[:7] if isinstance(r, GoodRequest)] == [1, 2, 4, 5, 7]
    assert sent[0] == GoodRequest(*MIX[0], 1)
