"""`ray.placement` (issue 33, item 1) without Ray: what each part reserves, and the settings refused
with a message naming the field. On a real cluster of several nodes: tests/test_multinode_job.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from presto_ray.job import JobConfig
from presto_ray.ray_config import PlacementConfig, RayConfig


def test_the_defaults_reserve_no_custom_resource_and_spread_replicas():
    placement = RayConfig().placement
    assert placement == PlacementConfig()
    assert placement.spread_replicas and placement.http_proxies == "EveryNode"
    assert not (placement.replica_resources or placement.coordinator_resources or placement.chain_actor_resources)


def test_a_job_config_places_each_part():
    config = JobConfig.model_validate({"ray": {"placement": {
        "replica_resources": {"presto_engine": 1}, "coordinator_resources": {"presto_coordinator": 0.5},
        "chain_actor_resources": {"presto_chains": 1}, "ingress_resources": {"presto_ingress": 1}, "http_proxies": "HeadOnly",
    }}})  # fmt: skip
    placement = config.ray.placement
    assert placement.replica_resources == {"presto_engine": 1.0} and placement.http_proxies == "HeadOnly"
    assert JobConfig.model_validate_json(config.model_dump_json()) == config  # what Serve and the stage receive

    pytest.importorskip("ray")
    from actors.cluster import coordinator_placement

    assert coordinator_placement(config.ray) == {"resources": {"presto_coordinator": 0.5}}


def test_the_serve_pools_coordinators_run_on_its_node_and_no_other(ray_address):
    """The pool reserved `coordinator_resources` itself; its shards go to its node only (softly,
    Ray once passed a new shard's lease on to an engine node, whose loss then failed every request
    through it). A job's coordinators without those resources stay soft on the driver's node."""
    import ray

    from actors.cluster import coordinator_placement

    here = ray.get_runtime_context().get_node_id()
    config = JobConfig.model_validate({"ray": {"placement": {"coordinator_resources": {"presto_coordinator": 1}}}})
    pool = coordinator_placement(config.ray, beside_this_process=True)["scheduling_strategy"]
    assert (pool.node_id, pool.soft) == (here, False)
    job = coordinator_placement(JobConfig().ray)["scheduling_strategy"]
    assert (job.node_id, job.soft) == (here, True)


@pytest.mark.parametrize(
    "placement, words",
    [
        ({"replica_resources": {"GPU": 1}}, "'GPU' is not a custom resource"),
        ({"coordinator_resources": {"presto_coordinator": 0}}, "must be above 0"),
        ({"chain_actor_resources": {"x": -1}}, "must be above 0"),
        ({"http_proxies": "Everywhere"}, "http_proxies"),
        ({"replica_spread": True}, "replica_spread"),  # a misspelt field is refused, not ignored
    ],
)
def test_bad_placements_are_refused_naming_the_field(placement, words):
    with pytest.raises(ValidationError, match=words):
        RayConfig.model_validate({"placement": placement})
