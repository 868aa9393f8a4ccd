"""Streaming through Ray on a real local cluster: chains stream through the coordinator to engine
replicas, request by request, with the serial chain's samples; refused and identical requests, and
two coordinators sharing a replica. (A replica killed mid-request: tests/test_ray_coordinator.py; a
stage actor or the coordinator killed mid-stream under the Ray Data job: tests/test_ray_data.py.)"""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from actors.cluster import SamplingCluster  # noqa: E402
from ray_helpers import assert_serial_samples, drive_pairs, toy_job, with_engine, with_sampler  # noqa: E402


def streaming_job(prompts: int = 4, chains: int = 2, token_latency_s: float = 0.0, **ray_settings):
    items, config = toy_job(prompts, chains, **ray_settings)
    return items, with_sampler(with_engine(config, token_latency_s=token_latency_s), schedule="streaming")


@pytest.fixture(scope="module")
def streaming_replicas(ray_address):
    """One toy replica for the module (2 ms per token: streams overlap); each test starts its own
    coordinator on it, so no test sees another's figures."""
    _, config = streaming_job(token_latency_s=0.002)
    cluster = SamplingCluster(config.engine, config.ray)
    yield cluster.replicas
    cluster.shutdown()


def test_streaming_chains_draw_the_serial_samples(streaming_replicas):
    items, config = streaming_job(token_latency_s=0.002)
    with SamplingCluster(config.engine, config.ray, replicas=streaming_replicas) as cluster:
        rows, results = drive_pairs(cluster, items, config)
        stats = cluster.snapshot()
        live = ray.get([replica.live_streams.remote() for replica in cluster.replicas])
    assert_serial_samples(rows, items, config)
    assert stats.accounting.calls == 0, "streaming chains make no batched calls"
    assert stats.counters.streamed_requests == stats.accounting.num_requests > 0
    chains = [r.stats for r in results]
    assert sum(c.requests for c in chains) > sum(c.requests_used for c in chains)  # it speculated
    assert sum(c.forked_requests for c in chains) > 0 and sum(c.aborted_requests for c in chains) > 0
    assert live == [0], "an aborted or finished request must not stay in a replica"
    assert stats.chains_active == 0


def test_a_request_the_engine_refuses_reaches_its_chain_as_an_error(streaming_replicas):
    from actors.stream_protocol import ChainActions
    from presto_ray.chain_stream import StartRequest
    from presto_ray.engines import ProposalRequest

    _, config = streaming_job()
    refused = ProposalRequest(("not a token",), (), 8, temperature=1.0, seed=1)  # the toy cannot hash it
    fine = ProposalRequest((5, 6), (), 8, temperature=1.0, seed=1)
    with SamplingCluster(config.engine, config.ray, replicas=streaming_replicas) as cluster:
        ray.get(cluster.coordinator.stream_open.remote("c", 4))
        starts = (StartRequest((0, (), 0), refused, 0.0), StartRequest((1, (), 0), fine, 0.5))
        events = {}
        while len(events) < 2:
            update = ray.get(cluster.coordinator.stream_exchange.remote("c", ChainActions(start=starts)))
            events.update((e.key[0], e) for e in update.events)
            starts = ()
        assert events[0].error and "ValueError" in events[0].error and events[0].completion is None
        assert events[1].error is None and len(events[1].completion.token_ids) == 8
        ray.get(cluster.coordinator.chain_finished.remote("c"))


def test_identical_streamed_requests_run_once(streaming_replicas):
    from actors.stream_protocol import ChainActions
    from presto_ray.chain import Chain
    from presto_ray.chain_stream import ChainStream

    _, config = streaming_job()
    with SamplingCluster(config.engine, config.ray, replicas=streaming_replicas) as cluster:
        starts = ChainStream(Chain((5, 6, 7), config.sampler, 0)).step(budget=4).starts
        for chain_id in ("a", "b"):
            ray.get(cluster.coordinator.stream_open.remote(chain_id, 4))
        updates = ray.get([cluster.coordinator.stream_exchange.remote(c, ChainActions(start=starts)) for c in "ab"])
        firsts = [{e.key: e for e in u.events} for u in updates]
        for chain_id, seen in zip("ab", firsts):  # each update holds what had landed: wait for the rest
            while not all(seen.get(r.key) and seen[r.key].completion for r in starts):
                update = ray.get(cluster.coordinator.stream_exchange.remote(chain_id, ChainActions()))
                seen.update((e.key, e) for e in update.events)
        stats = cluster.snapshot()
        tokens = [[list(seen[r.key].completion.token_ids) for r in starts] for seen in firsts]
        assert tokens[0] == tokens[1] and all(tokens[0]), "both chains get the one stream's completions"
        assert stats.counters.submitted_requests == 2 * len(starts)
        assert stats.counters.deduplicated == len(starts)
        assert stats.counters.streamed_requests == len(starts)
        for chain_id in ("a", "b"):
            ray.get(cluster.coordinator.chain_finished.remote(chain_id))


def test_two_coordinators_stream_through_one_replica(streaming_replicas):
    """Each coordinator polls only its own streams: sharing a replica loses and aborts nothing."""
    from actors.coordinator import start_coordinator
    from actors.stream_protocol import ChainActions
    from presto_ray.chain import Chain
    from presto_ray.chain_stream import ChainStream

    _, config = streaming_job(token_latency_s=0.002)
    with SamplingCluster(config.engine, config.ray, replicas=streaming_replicas) as cluster:
        other = start_coordinator(cluster.replicas, config.ray)
        try:
            chains = {c: Chain((5, 6, 7 + i), config.sampler.model_copy(update={"seed": i}), 0) for i, c in enumerate((cluster.coordinator, other))}
            refs = {c: c.stream_open.remote("x", 4) for c in chains}
            budgets = {c: ray.get(ref) for c, ref in refs.items()}
            starts = {c: ChainStream(chain).step(budget=budgets[c]).starts for c, chain in chains.items()}
            updates = {c: c.stream_exchange.remote("x", ChainActions(start=starts[c])) for c in chains}
            seen = {c: set() for c in chains}
            while any(len(seen[c]) < len(starts[c]) for c in chains):
                for c in chains:
                    if len(seen[c]) < len(starts[c]):
                        update = ray.get(updates[c], timeout=60)
                        seen[c].update(e.key for e in update.events if e.completion is not None)
                        assert all(e.error is None for e in update.events)
                        updates[c] = c.stream_exchange.remote("x", ChainActions()) if len(seen[c]) < len(starts[c]) else None
            assert all(seen[c] == {s.key for s in starts[c]} for c in chains)  # every request ended, none lost
            for c in chains:
                snapshot = ray.get(c.snapshot.remote())
                assert snapshot.counters.stream_aborts == 0
        finally:
            ray.kill(other, no_restart=True)
