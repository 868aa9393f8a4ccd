"""The job's bound on a part with no node to run on (actors/node_demands.py, deployments/node_watch.py,
actors/placement_wait.py): which parts a node table can hold, the clock of each missing one, and
the one line each wait stops with. The job on a real multi-node cluster: tests/test_multinode_job.py."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.data")

from actors.stage_base import JobFailed  # noqa: E402
from actors.node_demands import MissingNodes, NodeDemand, coordinator_demand, missing, replica_group_demand, service_demands  # noqa: E402
from actors.placement_wait import not_placed_message  # noqa: E402
from deployments.node_watch import JobNodeWatch, job_demands  # noqa: E402
from presto_ray.ray_config import RayConfig  # noqa: E402
from ray_helpers import toy_job  # noqa: E402

CHAINS = NodeDemand("the stage actors", "ray.placement.chain_actor_resources", {"presto_chains": 1})
ENGINE = NodeDemand("the engine replicas", "ray.placement.replica_resources", {"presto_engine": 1, "GPU": 1})


def node(alive: bool = True, **resources: float) -> dict:
    return {"Alive": alive, "Resources": {"CPU": 2.0, **resources}}


def test_a_part_is_missing_only_when_no_live_node_offers_all_it_reserves():
    nodes = [node(presto_chains=1), node(presto_engine=1)]  # an engine node without a GPU
    assert missing([CHAINS, ENGINE], nodes) == [ENGINE]
    assert missing([CHAINS, ENGINE], [*nodes, node(presto_engine=2, GPU=8)]) == []
    assert missing([CHAINS], [node(False, presto_chains=1)]) == [CHAINS]  # a dead node offers nothing
    assert missing([NodeDemand("anywhere", "", {})], []) == []  # reserving nothing, any node holds it


def test_the_watch_stops_the_job_once_a_part_has_been_missing_for_the_time_limit():
    watch = JobNodeWatch([CHAINS, ENGINE], timeout_s=10.0)
    both = [node(presto_chains=1), node(presto_engine=1, GPU=1)]
    watch.check(0.0, both)
    watch.check(5.0, both[1:])  # the chain node is lost: its clock starts
    watch.check(14.0, both)  # and it came back before the limit: forgotten
    watch.check(20.0, both[1:])
    watch.check(29.9, both[1:])
    with pytest.raises(JobFailed) as stopped:
        watch.check(30.0, both[1:])
    assert str(stopped.value) == (
        "no live node offers {presto_chains: 1}, which the stage actors reserve (ray.placement.chain_actor_resources), "
        "for 10 s (ray.missing_node_timeout_s: 10): the job stopped; the rows written so far are kept; "
        "rerun to resume once such a node is back"
    )


def test_a_jobs_demands_are_what_its_stage_actors_and_replicas_reserve():
    _, job = toy_job(placement={"chain_actor_resources": {"presto_chains": 1}, "replica_resources": {"presto_engine": 1}},
                     replica_num_cpus=1)  # fmt: skip
    stage, replicas = job_demands(job)
    assert stage.resources == {"presto_chains": 1} and replicas.resources == {"CPU": 1, "presto_engine": 1}
    _, anywhere = toy_job()
    assert [d.resources for d in job_demands(anywhere)] == [{}, {}]  # the toy reserves no GPU


def test_the_clock_names_the_first_part_missing_for_the_limit_and_how_long():
    clock = MissingNodes([CHAINS, ENGINE], timeout_s=3.0)
    assert clock.overdue(100.0, []) is None  # both missing from now on
    assert clock.overdue(102.0, [node(presto_chains=1)]) is None
    assert clock.overdue(103.5, [node(presto_chains=1)]) == (ENGINE, 3.5)


def test_the_start_that_cannot_place_a_part_says_which_and_where_it_is_set():
    _, job = toy_job(placement={"coordinator_resources": {"presto_coordinator": 1}})
    assert coordinator_demand(job.ray).resources == {"presto_coordinator": 1}
    assert not_placed_message(ENGINE, 3.2, 3.0) == (
        "cannot place the engine replicas: no live node offers {GPU: 1, presto_engine: 1}, which they reserve "
        "(ray.placement.replica_resources), and none joined for 3 s (ray.missing_node_timeout_s: 3); "
        "nothing is left running: add such a node or change those settings, then rerun"
    )


def test_the_time_limit_has_a_default_and_can_be_switched_off():
    assert RayConfig().missing_node_timeout_s == 600.0
    assert RayConfig(missing_node_timeout_s=None).missing_node_timeout_s is None


def test_a_strict_spread_group_needs_a_live_node_for_each_replica():
    """Each bundle of a STRICT_SPREAD group needs a node of its own: three replicas on two nodes
    that each offer a bundle wait for a third (was: not missing, so the start waited forever)."""
    spread = RayConfig(num_replicas=3, placement_strategy="STRICT_SPREAD", placement={"replica_resources": {"presto_engine": 1}})
    group = replica_group_demand(spread, 0)
    assert (group.resources, group.nodes) == ({"presto_engine": 1}, 3)
    two = [node(presto_engine=1), node(presto_engine=1), node()]
    assert missing([group], two) == [group]
    assert missing([group], [*two, node(False, presto_engine=1)]) == [group]  # a dead node holds nothing
    assert missing([group], [*two, node(presto_engine=1)]) == []
    # reserving nothing, a bundle still takes a thousandth of a CPU, on a node of its own
    anywhere = replica_group_demand(RayConfig(num_replicas=2, placement_strategy="STRICT_SPREAD"), 0)
    assert (anywhere.resources, anywhere.nodes) == ({"CPU": 0.001}, 2)
    assert MissingNodes([anywhere], 3.0).overdue(3.0, [node()]) is None  # the clock starts
    assert not_placed_message(anywhere, 3.4, 3.0, holders=1) == (
        "cannot place the engine replicas: each of the 2 needs a node of its own, and 1 live node offers "
        "{CPU: 0.001}, which each reserves (ray.placement_strategy: STRICT_SPREAD, ray.num_replicas: 2, "
        "ray.placement.replica_resources, ray.replica_num_cpus / num_gpus); no more joined for 3 s "
        "(ray.missing_node_timeout_s: 3); nothing is left running: add nodes or change those settings, then rerun"
    )


def test_a_strict_pack_group_needs_one_node_holding_every_bundle_and_soft_groups_one_bundle():
    pack = replica_group_demand(RayConfig(num_replicas=2, placement_strategy="STRICT_PACK", replica_num_cpus=1), 0)
    assert (pack.resources, pack.nodes) == ({"CPU": 2}, 1)
    assert missing([pack], [node()]) == [] and missing([pack], [{"Alive": True, "Resources": {"CPU": 1.0}}] * 2) == [pack]
    soft = replica_group_demand(RayConfig(num_replicas=4, placement_strategy="SPREAD", replica_num_cpus=1), 0)
    assert (soft.resources, soft.nodes) == ({"CPU": 1}, 1)  # SPREAD and PACK are soft: bundles share nodes


def test_the_service_waits_for_its_ingress_its_sampling_pool_and_the_engine_replicas():
    _, job = toy_job(placement={"ingress_resources": {"presto_ingress": 1}, "coordinator_resources": {"presto_coordinator": 1},
                                "replica_resources": {"presto_engine": 1}})  # fmt: skip
    ingress, pool, replicas = service_demands(job)
    assert (ingress.part, ingress.resources) == ("the ingress replicas", {"presto_ingress": 1})
    assert (pool.part, pool.resources, pool.settings) == ("the sampling pool", {"presto_coordinator": 1}, "ray.placement.coordinator_resources")
    assert (replicas.part, replicas.resources) == ("the engine replicas", {"presto_engine": 1})
    assert not_placed_message(pool, 3.0, 3.0).startswith(
        "cannot place the sampling pool: no live node offers {presto_coordinator: 1}, which it reserves (ray.placement.coordinator_resources)"
    )
    _, anywhere = toy_job()
    assert missing(service_demands(anywhere), []) == []  # reserving nothing: never missing
