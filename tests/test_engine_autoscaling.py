"""The engine pool grows and shrinks with the load (ray.replica_autoscaling): the rule on a fake
clock, then on a real local Ray cluster with the toy engine, where replicas added and retired while
chains run change no sample."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from pydantic import ValidationError

from actors.autoscaling_policy import ReplicaScalingPolicy, desired_replicas
from presto_ray import SamplerConfig, sample
from presto_ray.config import error_field, error_text
from presto_ray.engines import ToyEngineConfig
from presto_ray.ray_config import RayConfig, ReplicaAutoscalingConfig
from waiting import wait_for

SCALING = ReplicaAutoscalingConfig(min_replicas=1, max_replicas=3, target_ongoing_requests=10, upscale_delay_s=2, downscale_delay_s=5)


def test_desired_replicas_hold_the_target_within_bounds():
    assert [desired_replicas(load, SCALING) for load in (0, 1, 10, 11, 25, 1000)] == [1, 1, 1, 2, 3, 3]


def test_the_rule_waits_its_delays_and_restarts_them_when_the_load_turns():
    policy = ReplicaScalingPolicy(SCALING)
    assert policy.decide(0.0, 1, 25) == 1  # asks for 3, not yet
    assert policy.decide(1.9, 1, 25) == 1
    assert policy.decide(2.0, 1, 25) == 3  # asked for 2 s: scale up
    assert policy.decide(2.1, 3, 0) == 3  # asks for 1: the downscale delay starts
    assert policy.decide(4.0, 3, 25) == 3  # busy again: the request to shrink is forgotten
    assert policy.decide(5.0, 3, 0) == 3
    assert policy.decide(9.9, 3, 0) == 3  # 4.9 s since it turned
    assert policy.decide(10.0, 3, 15) == 2  # asked for fewer for 5 s: go to what the load wants now
    assert policy.decide(10.1, 2, 15) == 2


@pytest.mark.parametrize(
    "build, field, message",
    [
        (lambda: ReplicaAutoscalingConfig(min_replicas=3, max_replicas=2), "max_replicas", "max_replicas (2) is below min_replicas (3)"),
        (
            lambda: RayConfig(replica_autoscaling=SCALING, coordinator_shards=2),
            "replica_autoscaling.min_replicas",
            "replica_autoscaling.min_replicas (1) must be at least coordinator_shards (2)",
        ),
        (
            lambda: RayConfig(replica_autoscaling=SCALING, placement_strategy="PACK"),
            "placement_strategy",
            "replica_autoscaling cannot be combined with placement_strategy",
        ),
    ],
    ids=["bounds", "shards", "placement"],
)
def test_settings_refuse_what_autoscaling_cannot_do_naming_the_field(build, field, message):
    """One error, naming the field to change (what the CLI and HTTP messages print)."""
    with pytest.raises(ValidationError) as refused:
        build()
    (error,) = refused.value.errors()
    assert error_field(error) == field and error_text(error).startswith(message), error


def test_autoscaling_starts_with_min_replicas():
    assert RayConfig(replica_autoscaling=SCALING, num_replicas=5).initial_replicas == 1


# --- on a real local Ray cluster ------------------------------------------------------------------
PROMPTS = [(3, 4, 5), (9, 8), (7, 7, 1), (2, 6)]


def _configs(schedule, num_blocks=3):
    return [
        SamplerConfig(block_size=4, num_blocks=num_blocks, mh_steps=4, prefetch_budget=4, seed=seed, schedule=schedule)
        for seed in range(2 * len(PROMPTS))
    ]


def _run_chains(cluster, configs, out: dict) -> None:
    """Every config's chain through the cluster's coordinators (as the Ray drivers run them)."""
    from actors.chain_driver import drive_chain
    from presto_ray.chain import Chain

    eos = cluster.engine_spec.eos_token_id

    async def run():
        chains = [Chain(PROMPTS[k % len(PROMPTS)], c, eos) for k, c in enumerate(configs)]
        return await asyncio.gather(*(
            drive_chain(cluster.coordinators.for_prompt(chain.prompt), (f"autoscale-{id(out)}", k), chain)
            for k, chain in enumerate(chains)
        ))  # fmt: skip

    out["results"] = asyncio.run(run())


def _in_process(spec, configs):
    engine = spec.model_copy(update={"call_latency_s": 0.0, "token_latency_s": 0.0}).build()  # same model, no sleeps
    return [sample(engine, PROMPTS[k % len(PROMPTS)], c).token_ids for k, c in enumerate(configs)]


def test_the_pool_grows_under_load_and_shrinks_when_idle(ray_address):
    """min 1, max 2, 4 requests per replica: chains' rounds start a second replica, which takes
    calls; once idle it is retired and stopped (not counted as a failure). Same samples."""
    import ray

    from actors.cluster import SamplingCluster

    spec = ToyEngineConfig(call_latency_s=0.25)
    scaling = ReplicaAutoscalingConfig(
        min_replicas=1, max_replicas=2, target_ongoing_requests=4, upscale_delay_s=0, downscale_delay_s=2, interval_s=0.1
    )  # a replica asked for is cancelled if the load drops for downscale_delay_s before it starts: 2 s outlasts a dip
    configs = _configs("rounds", num_blocks=8)  # long enough to outlast a replica's start
    cluster = SamplingCluster(spec, RayConfig(replica_autoscaling=scaling))
    try:
        assert cluster.active_replicas == [0]
        out: dict = {}
        runner = threading.Thread(target=_run_chains, args=(cluster, configs, out))
        runner.start()
        wait_for(lambda: cluster.active_replicas == [0, 1], 30, "a replica added under load")
        runner.join(timeout=120)
        assert [r.token_ids for r in out["results"]] == _in_process(spec, configs)
        snapshot = cluster.snapshot()
        assert snapshot.calls_per_replica[1] > 0, snapshot.calls_per_replica
        wait_for(lambda: cluster.stopped == {1}, 30, "the idle replica stopped")
        assert cluster.autoscaler.started_replicas == [1] == cluster.autoscaler.joined_replicas
        assert cluster.autoscaler.stopped_replicas == [1]
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(cluster.replicas[1].ready.remote(), timeout=30)
        after = cluster.snapshot()
        assert after.counters.replica_failures == 0 and after.active_replicas == 1
    finally:
        cluster.shutdown()


@pytest.mark.parametrize("schedule", ["rounds", "streaming"])
def test_a_replica_retired_mid_run_finishes_its_work_and_changes_no_sample(ray_address, schedule):
    """The pool's moves by hand (the autoscaler's thread stopped): a replica added, then retired
    while chains run on it; its running calls or streams end where they are, new work goes to the
    other, and it is stopped only once drained."""
    from actors.cluster import SamplingCluster

    spec = ToyEngineConfig(call_latency_s=0.1, token_latency_s=0.004)
    scaling = ReplicaAutoscalingConfig(min_replicas=1, max_replicas=2)
    configs = _configs(schedule)
    cluster = SamplingCluster(spec, RayConfig(replica_autoscaling=scaling))
    try:
        cluster.autoscaler.stop()
        assert cluster.add_replica() == 1 and cluster.join_placed(timeout_s=60) == [1]
        out: dict = {}
        runner = threading.Thread(target=_run_chains, args=(cluster, configs, out))
        runner.start()
        busy = lambda: cluster.snapshot().inflight_requests_per_replica[1] or cluster.snapshot().streams_running  # noqa: E731
        wait_for(busy, 30, "work on the added replica")
        at_retirement = cluster.snapshot()
        assert cluster.retire_replica() == 1
        assert cluster.active_replicas == [0]
        runner.join(timeout=180)
        assert not runner.is_alive()
        assert [r.token_ids for r in out["results"]] == _in_process(spec, configs)
        # no call started on it after its retirement (calls are counted when they end)
        limit = at_retirement.calls_per_replica[1] + at_retirement.inflight_calls_per_replica[1]
        assert cluster.snapshot().calls_per_replica[1] <= limit
        wait_for(lambda: cluster.stop_drained() == [1] or cluster.stopped == {1}, 30, "the retired replica stopped once drained")
        assert cluster.snapshot().counters.replica_failures == 0
    finally:
        cluster.shutdown()


def test_a_replica_no_node_can_hold_waits_apart_and_blocks_nothing(ray_address):
    """A replica asked for while no node can hold it (on KubeRay: before the GPU node its demand
    starts has joined) is pending: `add_replica` returns at once (it waited for the node: forever,
    here), the coordinators serve with the replica they have (same samples), the autoscaler counts
    it (it does not ask twice) and cancels it first when the load goes; the shutdown stops it
    without waiting for it."""
    import ray

    from actors.cluster import SamplingCluster
    from presto_ray.ray_config import PlacementConfig
    from ray_helpers import InBackground

    spec = ToyEngineConfig()
    scaling = ReplicaAutoscalingConfig(max_replicas=3, target_ongoing_requests=1000, upscale_delay_s=0, downscale_delay_s=0)
    cluster = SamplingCluster(spec, RayConfig(replica_autoscaling=scaling))
    try:
        cluster.autoscaler.stop()
        # replicas asked for from now on reserve a resource no node of this Ray offers
        cluster.settings = cluster.settings.model_copy(update={"placement": PlacementConfig(replica_resources={"presto_nowhere": 1})})
        asked = time.monotonic()
        assert InBackground(cluster.add_replica).result(timeout=30) == 1
        print(f"\nadd_replica returned in {time.monotonic() - asked:.2f} s")
        assert cluster.pending_replicas == [1] and cluster.active_replicas == [0]
        assert cluster.join_placed(timeout_s=1) == [] and cluster.pending_replicas == [1]
        configs = _configs("rounds", num_blocks=1)
        out: dict = {}
        _run_chains(cluster, configs, out)  # served by replica 0 meanwhile
        assert [r.token_ids for r in out["results"]] == _in_process(spec, configs)
        assert cluster.snapshot().active_replicas == 1
        # the rule wants 1 (no load) of 2 counted (the pending one included): the pending one goes
        assert cluster.autoscaler.step(time.monotonic()) == 1
        assert cluster.pending_replicas == [] and cluster.stopped == {1} and cluster.active_replicas == [0]
        pending = cluster.replicas[cluster.add_replica()]  # another, pending at shutdown
        stopping = time.monotonic()
        cluster.shutdown()
        assert time.monotonic() - stopping < 30
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(pending.ready.remote(), timeout=30)
    finally:
        cluster.shutdown()


def test_a_restarted_coordinator_is_handed_the_replicas_added_since(ray_address):
    import ray

    from actors.cluster import SamplingCluster

    cluster = SamplingCluster(ToyEngineConfig(), RayConfig(replica_autoscaling=ReplicaAutoscalingConfig(max_replicas=2)))
    try:
        cluster.autoscaler.stop()
        assert cluster.add_replica() == 1 and cluster.join_placed(timeout_s=60) == [1]
        assert cluster.snapshot().active_replicas == 2
        ray.kill(cluster.coordinator, no_restart=False)
        # Ray restarts it with the replicas it was started with
        wait_for(lambda: _active_replicas(cluster) == 1, 60, "the coordinator back with the replicas it was started with")
        assert cluster.autoscaler.step(time.monotonic()) == 2
        assert cluster.snapshot().active_replicas == 2
        results = {}
        _run_chains(cluster, _configs("rounds", num_blocks=1), results)
        assert len(results["results"]) == 2 * len(PROMPTS)
    finally:
        cluster.shutdown()


def _active_replicas(cluster) -> int | None:
    try:
        return cluster.coordinators.snapshot_blocking(timeout=5).active_replicas
    except Exception:  # still restarting
        return None


def test_replicas_added_to_a_sharded_pool_join_one_shard(ray_address):
    """Two coordinator shards: replica 2 joins shard 0 (i mod shards), the cluster's snapshot
    still combines, and chains of every prompt still give the in-process samples."""
    from actors.cluster import SamplingCluster

    spec = ToyEngineConfig()
    settings = RayConfig(coordinator_shards=2, replica_autoscaling=ReplicaAutoscalingConfig(min_replicas=2, max_replicas=3))
    configs = _configs("rounds", num_blocks=1)
    cluster = SamplingCluster(spec, settings)
    try:
        cluster.autoscaler.stop()
        assert cluster.add_replica() == 2 and cluster.join_placed(timeout_s=60) == [2]
        snapshot = cluster.snapshot()
        assert snapshot.active_replicas == 3 and len(snapshot.calls_per_replica) == 3
        out: dict = {}
        _run_chains(cluster, configs, out)
        assert [r.token_ids for r in out["results"]] == _in_process(spec, configs)
        assert cluster.retire_replica() == 2 and cluster.stop_drained() == [2]
        assert cluster.snapshot().active_replicas == 2
    finally:
        cluster.shutdown()
