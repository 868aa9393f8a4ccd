"""How the coordinator learns that a chain is over when its driver cannot say so: a cancelled
caller (an HTTP client that left) and a driver that went silent. A chain wrongly left active holds
every later round to the batch window, so these run on a real local Ray cluster with the toy engine."""

from __future__ import annotations

import pytest

from presto_ray.engines.base import ProposalRequest
from waiting import wait_for

pytest.importorskip("ray")


def _requests(prompt, n):
    return [ProposalRequest(prompt, (), 2, 1.0, seed=k) for k in range(n)]


@pytest.fixture(scope="module")
def slow_cluster(ray_address):
    from actors.cluster import SamplingCluster
    from presto_ray.engines import ToyEngineConfig
    from presto_ray.ray_config import RayConfig

    cluster = SamplingCluster(ToyEngineConfig(call_latency_s=1.0), RayConfig(chain_idle_timeout_s=1.0))
    yield cluster
    cluster.shutdown()


@pytest.mark.parametrize("schedule", ["rounds", "streaming"])
def test_a_cancelled_driver_leaves_no_active_chain(slow_cluster, schedule):
    """A driver task is cancelled (recursively, as Ray Serve cancels a request whose client left)
    while its chain waits for a call: the coordinator counts the chain as over at once, although
    the driver's own `chain_finished` may be cancelled with it."""
    import ray

    from actors.chain_driver import drive_chain
    from presto_ray.chain import Chain
    from presto_ray.config import SamplerConfig

    @ray.remote(num_cpus=0)
    class Driver:
        def __init__(self, coordinator):
            self.coordinator = coordinator

        async def run(self, chain_id, schedule):
            config = SamplerConfig(block_size=4, num_blocks=2, mh_steps=3, schedule=schedule)
            chain = Chain((5, 6, 7), config, eos_token_id=None)
            return await drive_chain(self.coordinator, chain_id, chain)

    coordinator = slow_cluster.coordinator
    before = slow_cluster.snapshot().counters
    driver = Driver.remote(coordinator)
    run = driver.run.remote(("cancelled", schedule), schedule)
    wait_for(lambda: slow_cluster.snapshot().chains_active == 1, 10, "the chain active")
    ray.cancel(run)
    with pytest.raises((ray.exceptions.TaskCancelledError, ray.exceptions.RayTaskError)):
        ray.get(run, timeout=30)
    # the cancellation itself ended the chain, not the silent-chain expiry (chains_expired below);
    # the rule is tested exactly on the books (tests/test_call_book.py); this is a smoke bound
    wait_for(lambda: slow_cluster.snapshot().chains_active == 0, 10, "no active chain once the driver was cancelled")
    after = slow_cluster.snapshot().counters
    assert after.chains_finished - before.chains_finished == 1
    assert after.chains_expired == before.chains_expired
    assert slow_cluster.snapshot().streams_running == 0
    ray.kill(driver)


def test_a_cancelled_submit_ends_its_chain(slow_cluster):
    import ray

    coordinator = slow_cluster.coordinator
    before = slow_cluster.snapshot().counters
    call = coordinator.submit.remote(("gone", 0), _requests((1, 2), 3))
    wait_for(lambda: slow_cluster.snapshot().chains_active == 1, 10, "the submitting chain active")
    ray.cancel(call)
    wait_for(lambda: slow_cluster.snapshot().chains_active == 0, 10, "no active chain once its submit was cancelled")
    assert slow_cluster.snapshot().counters.chains_abandoned - before.chains_abandoned == 1
    # a late submit of the cancelled chain is still answered, but does not make it active again
    assert len(ray.get(coordinator.submit.remote(("gone", 0), _requests((1, 2), 1)), timeout=30)) == 1
    assert slow_cluster.snapshot().chains_active == 0


def test_a_silent_chain_stops_holding_rounds_back(slow_cluster):
    """A registered chain that never calls (its driver died without a word) is dropped from the
    active chains after chain_idle_timeout_s (1 s here), and joins again when it does call."""
    import ray

    coordinator = slow_cluster.coordinator
    before = slow_cluster.snapshot().counters
    ray.get(coordinator.register_chains.remote([("silent", 0)]))
    assert slow_cluster.snapshot().chains_active == 1
    wait_for(lambda: slow_cluster.snapshot().chains_active == 0, 5, "the silent chain expired")
    assert slow_cluster.snapshot().counters.chains_expired - before.chains_expired == 1
    # a chain waiting on a call is never expired, however long the call takes (1 s here)
    call = coordinator.submit.remote(("silent", 0), _requests((3, 4), 2))
    wait_for(lambda: slow_cluster.snapshot().chains_active == 1, 10, "the chain active again once it calls")
    assert len(ray.get(call, timeout=30)) == 2
    ray.get(coordinator.chain_finished.remote(("silent", 0)))
    assert slow_cluster.snapshot().counters.chains_expired - before.chains_expired == 1
    assert slow_cluster.snapshot().chains_active == 0
