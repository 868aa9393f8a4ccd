"""The coordinator's batching policy on a fake clock, in milliseconds: the README's window sweep.

A discrete-event model of the measured set-up (16 chains on 2 chain actors, a 50 ms call, one
call in flight): an actor plans the chains its completions woke one after another (2 ms each, 60
ms when the predictor refits), and the coordinator applies `BatchingPolicy` exactly as it does
(a finished call counts as activity). Without a quiet period rounds split into several calls;
from 100 ms on, every round is one call, as measured on Ray.
"""

import heapq
import itertools

import pytest

from actors.batching import BatchingPolicy

CHAINS, ACTORS, ROUNDS = 16, 2, 9
PLAN_S, REFIT_S, CALL_S = 0.002, 0.060, 0.050


def refits(chain: int, round_: int) -> bool:
    return (round_ + chain) % 4 == 0  # a refit every few rounds, staggered across chains


def simulate(policy: BatchingPolicy) -> list[int]:
    """Sizes of the calls made until every chain has done ROUNDS rounds."""
    events, order = [], itertools.count()
    push = lambda t, kind, data=None: heapq.heappush(events, (t, next(order), kind, data))  # noqa: E731
    active, waiting, rounds = set(range(CHAINS)), set(), [0] * CHAINS
    actor_free = [0.0] * ACTORS
    queue: list[tuple[int, float]] = []
    inflight, last_activity, calls = 0, 0.0, []

    def plan(chain: int, now: float) -> None:
        actor = chain % ACTORS
        start = max(now, actor_free[actor])
        actor_free[actor] = start + PLAN_S + (REFIT_S if refits(chain, rounds[chain]) else 0.0)
        push(actor_free[actor], "submit", chain)

    def dispatch(now: float) -> None:
        nonlocal inflight
        released = policy.round_released(now, last_activity, len(waiting) >= len(active))
        while policy.can_call(inflight) and queue and policy.should_dispatch(now, len(queue), queue[0][1], released):
            batch = [queue.pop(0)[0] for _ in range(policy.batch_size(len(queue)))]
            inflight += 1
            calls.append(len(batch))
            push(now + CALL_S, "done", batch)
        if policy.can_call(inflight):
            deadline = policy.next_deadline(last_activity, queue[0][1] if queue else None)
            if deadline is not None:
                push(max(deadline, now), "timer")

    for chain in range(CHAINS):
        plan(chain, 0.0)
    while events:
        now, _, kind, data = heapq.heappop(events)
        if kind == "submit":
            queue.append((data, now))
            waiting.add(data)
            last_activity = now
        elif kind == "done":
            inflight -= 1
            last_activity = now
            for chain in data:
                waiting.discard(chain)
                rounds[chain] += 1
                if rounds[chain] < ROUNDS:
                    plan(chain, now)
                else:
                    active.discard(chain)
        dispatch(now)
    assert rounds == [ROUNDS] * CHAINS
    return calls


def policy(window_ms: float, inflight: int = 1) -> BatchingPolicy:
    return BatchingPolicy(window_ms / 1000, max_batch_wait_s=0.5, max_requests_per_call=1024, max_inflight_calls=inflight)


def test_short_windows_split_rounds_into_several_calls():
    calls = {w: simulate(policy(w)) for w in (0, 20, 50)}
    assert all(sum(c) == CHAINS * ROUNDS for c in calls.values())
    assert len(calls[0]) > len(calls[20]) > len(calls[50]) > ROUNDS  # README: 18, 15, 15 calls vs 9
    assert len(simulate(policy(0, inflight=2))) > len(calls[0])  # a second call in flight splits more


@pytest.mark.parametrize("window_ms, inflight", [(100, 1), (100, 2), (200, 1)])
def test_a_100ms_quiet_period_makes_every_round_one_call(window_ms, inflight):
    assert simulate(policy(window_ms, inflight)) == [CHAINS] * ROUNDS


def test_a_full_queue_and_an_old_request_go_without_waiting():
    p = BatchingPolicy(10.0, max_batch_wait_s=0.5, max_requests_per_call=4, max_inflight_calls=1)
    assert not p.should_dispatch(now=0.1, queued=3, oldest_enqueued=0.0, released=False)
    assert p.should_dispatch(now=0.1, queued=4, oldest_enqueued=0.0, released=False)
    assert p.should_dispatch(now=0.5, queued=1, oldest_enqueued=0.0, released=False)
    assert p.batch_size(9) == 4 and not p.can_call(1)
    assert p.next_deadline(last_activity=1.0, oldest_enqueued=0.9) == pytest.approx(1.4)
    assert p.next_deadline(last_activity=1.0, oldest_enqueued=None) is None
