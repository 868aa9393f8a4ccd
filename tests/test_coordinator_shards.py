"""Coordinator shards, without Ray: which shard a prompt goes to, which replicas each shard drives,
and how the shards' snapshots add up."""

from __future__ import annotations

import dataclasses

import pytest

from actors.coordinator_shards import CoordinatorShards, prefix_key, rendezvous_order, shard_replicas
from actors.coordinator_stats import CoordinatorCounters, CoordinatorSnapshot
from presto_ray.engines.base import CallAccounting


def test_replicas_are_partitioned_or_shared():
    assert shard_replicas(4, 2) == [[0, 2], [1, 3]]
    assert shard_replicas(5, 2) == [[0, 2, 4], [1, 3]]
    assert shard_replicas(3, 1) == [[0, 1, 2]]
    assert shard_replicas(1, 3) == [[0], [0], [0]], "fewer replicas than shards: every shard uses all"


def test_a_prompt_goes_to_one_shard_by_its_prefix():
    shards = CoordinatorShards(["a", "b", "c", "d"], affinity_tokens=4)
    prompts = [[i, i + 1, i + 2, i + 3, 99] for i in range(400)]
    chosen = [shards.for_prompt(p) for p in prompts]
    # past affinity_tokens the prompt does not matter: chains sharing a prefix share a shard
    assert chosen == [shards.for_prompt(p[:4] + [7, 7, 7]) for p in prompts]
    counts = {h: chosen.count(h) for h in "abcd"}
    assert all(60 < c < 140 for c in counts.values()), counts  # spread evenly (400 / 4 = 100)
    assert CoordinatorShards(["only"], 4).for_prompt([1, 2]) == "only"
    with pytest.raises(ValueError):
        CoordinatorShards([], 4)


def test_adding_a_shard_moves_only_the_prompts_it_takes():
    keys = [prefix_key([i, 2 * i], 64) for i in range(1000)]
    before = [rendezvous_order(k, 3, "shard")[0] for k in keys]
    after = [rendezvous_order(k, 4, "shard")[0] for k in keys]
    moved = [(b, a) for b, a in zip(before, after) if b != a]
    assert all(a == 3 for _, a in moved), "a prompt only ever moves to the new shard"
    assert 150 < len(moved) < 350  # about a quarter


def snapshot(calls, healthy, submitted, max_call, replica_calls):
    return CoordinatorSnapshot(
        counters=CoordinatorCounters(submitted_requests=submitted, max_requests_per_call=max_call),
        accounting=CallAccounting(calls=calls, num_requests=submitted),
        calls_per_replica=replica_calls,
        inflight_calls_per_replica=[0] * len(replica_calls),
        healthy=healthy,
        queue_depth=1,
        chains_active=2,
    )


def test_shard_snapshots_combine_into_the_clusters():
    a = snapshot(3, [True, True], 10, 4, [3, 0])
    b = snapshot(5, [True, False], 30, 7, [0, 5])
    both = CoordinatorSnapshot.combine([a, b])
    assert both.shards == 2
    assert both.counters.submitted_requests == 40 and both.counters.max_requests_per_call == 7
    assert both.accounting.calls == 8 and both.calls_per_replica == [3, 5]
    assert both.healthy == [True, False]
    assert (both.queue_depth, both.chains_active) == (2, 4)
    assert both.requests_per_call == 40 / 8
    assert CoordinatorSnapshot.combine([a]) is a


def test_a_shard_that_did_not_answer_or_restarted_makes_the_figures_incomplete():
    a = snapshot(3, [True, True], 10, 4, [3, 0])
    restarted = dataclasses.replace(snapshot(5, [True, False], 30, 7, [0, 5]), incomplete_shards=1)
    both = CoordinatorSnapshot.combine([a, CoordinatorSnapshot.unanswered(), restarted])
    assert both.incomplete_shards == 2 and both.shards == 3
    assert both.counters.submitted_requests == 40 and both.accounting.calls == 8, "the answering shards' figures are kept"
    assert CoordinatorSnapshot.combine([a, a]).incomplete_shards == 0

