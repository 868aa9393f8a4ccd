"""The coordinator's books of rounds without Ray, on a fake clock (plain numbers for time): dedup,
failover with counted attempts, probes, retiring replicas, silent chains, fair takes. Each test
asserts the exact commands an event produced."""

from __future__ import annotations

import functools

import numpy as np

from actors.coordinator_commands import ReplicaLost, SendCall, Settle
from actors.coordinator_core import CoordinatorCore
from presto_ray.engines.base import CallAccounting, Completion, ProposalRequest
from presto_ray.ray_config import RayConfig


def core(replicas: int = 2, **settings) -> CoordinatorCore:
    defaults = dict(batch_window_s=0.1, max_batch_wait_s=0.5, chain_idle_timeout_s=10.0, max_call_attempts=2)
    return CoordinatorCore(RayConfig(**{**defaults, **settings}), list(range(replicas)), replicas, epoch="e")


def request(seed: int, prompt=(1, 2)) -> ProposalRequest:
    return ProposalRequest(prompt, (), 2, 1.0, seed=seed)


@functools.cache  # one object per seed: Settle commands compare equal by identity of their arrays
def completion(seed: int) -> Completion:
    return Completion((seed, seed), np.zeros(2), np.zeros(2), "length")


def test_identical_requests_are_computed_once_across_chains_even_in_flight():
    c = core(replicas=1)
    c.register([("a", 0), ("b", 0)], now=0.0)
    assert c.calls.submit(("a", 0), [request(0), request(1)], now=0.0) == [request(0), request(1)]
    assert c.dispatch(0.01) == [], "b has not planned and the window is open"
    assert c.calls.submit(("b", 0), [request(1)], now=0.02) == [], "queued already: nothing new"
    (call,) = c.dispatch(0.02)  # every chain has planned: the round goes
    assert call == SendCall(0, 0, (request(0), request(1)))
    assert c.calls.submit(("c", 0), [request(0)], now=0.03) == [], "in flight: joins the call"
    settles = c.calls.call_finished(0, [completion(0), completion(1)], CallAccounting(calls=1, num_requests=2), now=0.1)
    assert settles == [Settle(request(0), completion(0)), Settle(request(1), completion(1))]
    assert c.counters.submitted_requests == 4 and c.counters.deduplicated == 2
    assert c.calls.pending == set() and c.snapshot().calls_per_replica == [1]
    assert c.calls.submit(("c", 0), [request(0)], now=0.2) == [request(0)], "answered: a new request again"


def test_a_dead_replicas_calls_are_rerouted_with_attempts_counted_and_fail_after_max():
    c = core(replicas=2, max_call_attempts=2)
    c.register([("a", 0)], now=0.0)
    r = request(0)
    c.calls.submit(("a", 0), [r], now=0.0)
    (first,) = c.dispatch(0.0)
    lost = c.calls.call_lost(first.call_id, now=0.1)
    assert lost == [ReplicaLost(first.replica, probe=True)], "re-queued, not settled"
    other = 1 - first.replica
    assert [q.request for q in c.table[other].queue] == [r] and c.table[other].queue[0].attempts == 1
    (second,) = c.dispatch(0.1)
    assert second == SendCall(1, other, (r,))
    lost = c.calls.call_lost(second.call_id, now=0.2)
    assert lost[0] == ReplicaLost(other, probe=True)
    (settle,) = lost[1:]
    assert settle.request == r and str(settle.error) == "request failed on 2 dying replicas"
    assert c.counters.replica_failures == 2 and c.counters.resent_requests == 1
    assert c.snapshot().healthy == [False, False] and c.snapshot().inflight_calls_per_replica == [0, 0]


def test_a_probe_restores_a_replica_and_a_failed_probe_fails_what_waits():
    c = core(replicas=1, max_call_attempts=3)
    c.register([("a", 0)], now=0.0)
    c.calls.submit(("a", 0), [request(0)], now=0.0)
    (call,) = c.dispatch(0.0)
    assert c.calls.call_lost(call.call_id, now=0.1) == [ReplicaLost(0, probe=True)]
    assert c.dispatch(5.0) == [], "the only replica is down: the request waits"
    assert c.probe_answered(0) == []
    assert c.dispatch(5.0) == [SendCall(1, 0, (request(0),))]
    assert c.calls.call_lost(1, now=6.0) == [ReplicaLost(0, probe=True)]
    (settle,) = c.probe_gave_up(0)
    assert settle.request == request(0) and str(settle.error) == "every engine replica died"


def test_a_retiring_replica_is_drained_and_takes_no_new_work():
    c = core(replicas=2)
    c.register([("a", 0)], now=0.0)
    requests = [request(k, prompt=(k, 9)) for k in range(8)]
    c.calls.submit(("a", 0), requests, now=0.0)
    assert c.table[0].queue and c.table[1].queue, "both replicas hold prompts"
    busy = c.dispatch(0.0)
    c.calls.submit(("a", 0), [request(100 + k, prompt=(k, 9)) for k in range(8)], now=0.01)
    c.retire_replica(1)
    assert not c.table[1].queue, "its queue went to replica 0"
    assert not c.replica_drained(1), "its call is still running"
    call = next(s for s in busy if s.replica == 1)
    c.calls.call_finished(call.call_id, [completion(0)] * len(call.requests), CallAccounting(), now=0.1)
    assert c.replica_drained(1) and c.snapshot().active_replicas == 1
    c.calls.submit(("a", 1), [request(200 + k, prompt=(k, 9)) for k in range(8)], now=0.2)
    assert not c.table[1].queue


def test_a_silent_chain_expires_after_the_idle_timeout_and_comes_back_when_it_calls():
    c = core(replicas=1, chain_idle_timeout_s=1.0)
    c.register([("silent", 0), ("busy", 0)], now=0.0)
    c.calls.submit(("busy", 0), [request(0)], now=0.0)  # waits: never expired, however long
    c.dispatch(0.5)
    assert c.chains.active == {("silent", 0), ("busy", 0)}
    c.dispatch(1.01)
    assert c.chains.active == {("busy", 0)} and c.counters.chains_expired == 1
    assert c.chains.all_planned(), "the silent chain no longer holds rounds back"
    c.calls.submit(("silent", 0), [request(1)], now=1.5)
    assert ("silent", 0) in c.chains.active
    c.calls.submit_done(("silent", 0), now=1.6)
    c.dispatch(2.0)
    assert ("silent", 0) in c.chains.active, "called 0.4 s ago"
    c.chain_finished(("silent", 0))
    c.calls.submit(("silent", 0), [request(2)], now=3.0)  # a late submit of a finished chain
    assert ("silent", 0) not in c.chains.active and c.counters.chains_finished == 1


def test_a_cancelled_caller_ends_its_chain_at_once():
    c = core(replicas=1)
    c.register([("gone", 0)], now=0.0)
    c.calls.submit(("gone", 0), [request(0)], now=0.0)
    assert c.caller_cancelled(("gone", 0)) == []
    assert c.chains.active == set() and c.counters.chains_abandoned == 1 and c.counters.chains_finished == 1
    assert c.chain_finished(("gone", 0)) == [] and c.counters.chains_finished == 1, "said twice: counted once"


def test_a_call_takes_round_robin_over_request_groups():
    c = core(replicas=1, max_requests_per_call=4)
    c.register([("big", 0), ("small", 0)], now=0.0)
    c.calls.submit(("big", 0), [request(k) for k in range(8)], now=0.0)
    c.calls.submit(("small", 0), [request(100), request(101)], now=0.001)
    first, *rest = c.dispatch(0.002)  # max_inflight_calls is 1: one call now
    assert rest == [] and first == SendCall(0, 0, (request(0), request(1), request(100), request(101)))
    assert [q.request for q in c.table[0].queue] == [request(k) for k in range(2, 8)]


def test_dispatch_deadlines_follow_the_window_and_the_expiry_scan():
    c = core(replicas=1, batch_window_s=0.1, max_batch_wait_s=0.5, chain_idle_timeout_s=8.0)
    assert c.next_deadline() is None, "nothing queued, no chain: sleep until an event"
    c.register([("a", 0), ("b", 0)], now=0.0)
    assert c.next_deadline() == 0.0, "the first silent-chain scan"
    c.dispatch(0.0)
    assert c.next_deadline() == 1.0
    c.calls.submit(("a", 0), [request(0)], now=0.3)
    assert c.next_deadline() == 0.3 + 0.1
    assert c.dispatch(0.35) == [] and len(c.dispatch(0.4)) == 1
