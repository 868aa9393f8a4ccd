"""Streaming through Ray on a real local cluster: chain actors stream through the coordinator to
engine replicas, request by request; the samples are the serial chain's, whatever dies mid-stream."""

from __future__ import annotations

import time

import pytest

from presto_ray.output import read_samples

ray = pytest.importorskip("ray")

from deployments.batch_job import RayJob  # noqa: E402
from test_ray_job import SAMPLE_FIELDS, by_pair, reference, toy_job  # noqa: E402


def streaming_job(prompts: int = 4, chains: int = 2, token_latency_s: float = 0.0, **ray_settings):
    items, config = toy_job(prompts, chains, **ray_settings)
    engine = config.engine.model_copy(update={"token_latency_s": token_latency_s})
    sampler = config.sampler.model_copy(update={"schedule": "streaming"})
    return items, config.model_copy(update={"engine": engine, "sampler": sampler})


def serial_reference(items, config) -> dict:
    """The in-process serial chain's samples (same seeds): what every schedule must write."""
    serial = config.sampler.model_copy(update={"traversal": "serial", "schedule": "rounds"})
    return reference(items, config.model_copy(update={"sampler": serial}))


def assert_serial_samples(out, items, config) -> None:
    """Every pair written once, with the serial chain's tokens, text and decisions."""
    rows = read_samples(out).to_pylist()
    got, expected = by_pair(rows), serial_reference(items, config)
    assert len(got) == len(rows), "a (prompt, chain) pair was written twice"
    assert got.keys() == expected.keys()
    for pair, row in got.items():
        for field in set(SAMPLE_FIELDS) - {"config"}:  # the config column says "streaming"
            assert row[field] == expected[pair][field], (pair, field)


def run_job(items, config, out, on_sample=None):
    job = RayJob(items, config, out)
    try:
        summary = job.run(on_sample=on_sample)
        live = ray.get([replica.live_streams.remote() for replica in job.replicas])
        return summary, job.snapshot(), live, job
    finally:
        job.shutdown()


def test_streaming_job_writes_the_serial_samples(ray_address, tmp_path):
    # two replicas stream in the replica-failover test and in test_ray_data's 2-shard job
    items, config = streaming_job(num_replicas=1)
    summary, stats, live, _ = run_job(items, config, tmp_path / "out")
    assert_serial_samples(tmp_path / "out", items, config)
    assert stats.accounting.calls == 0, "streaming chains make no batched calls"
    assert stats.counters.streamed_requests == stats.accounting.num_requests > 0
    assert summary.chains.requests > summary.chains.requests_used  # it speculated
    assert summary.chains.forked_requests > 0 and summary.chains.aborted_requests > 0
    assert live == [0], "an aborted or finished request must not stay in a replica"
    assert stats.chains_active == 0


def test_a_request_the_engine_refuses_reaches_its_chain_as_an_error(ray_address):
    from actors.cluster import SamplingCluster
    from actors.stream_protocol import ChainActions
    from presto_ray.chain import StartRequest
    from presto_ray.engines import ProposalRequest

    _, config = streaming_job()
    refused = ProposalRequest(("not a token",), (), 8, temperature=1.0, seed=1)  # the toy cannot hash it
    fine = ProposalRequest((5, 6), (), 8, temperature=1.0, seed=1)
    with SamplingCluster(config.engine, config.ray) as cluster:
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


def test_identical_streamed_requests_run_once(ray_address):
    from actors.cluster import SamplingCluster
    from actors.stream_protocol import ChainActions
    from presto_ray.chain import Chain

    _, config = streaming_job()
    with SamplingCluster(config.engine, config.ray) as cluster:
        starts = tuple(Chain((5, 6, 7), config.sampler, 0).start_requests(4))
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


def _wait_for_live_streams(job, deadline_s: float = 60.0) -> int:
    """Index of a replica with a request running on it now."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        live = ray.get([replica.live_streams.remote() for replica in job.replicas])
        busy = [i for i, n in enumerate(live) if n]
        if busy:
            return busy[0]
        time.sleep(0.005)
    raise AssertionError("no request was ever running on a replica")


@pytest.mark.parametrize("replicas", [1, 2], ids=["restarted-replica", "other-replica"])
def test_a_replica_killed_mid_request_changes_no_sample(ray_address, tmp_path, replicas):
    items, config = streaming_job(token_latency_s=0.01, num_replicas=replicas)
    killed = []

    def kill_mid_request(row):
        if not killed:
            busy = _wait_for_live_streams(job)
            ray.kill(job.replicas[busy], no_restart=False)
            killed.append(busy)

    job = RayJob(items, config, tmp_path / "out")
    try:
        summary = job.run(on_sample=kill_mid_request)
        stats = job.snapshot()
    finally:
        job.shutdown()
    assert killed and stats.counters.replica_failures >= 1 and stats.counters.resent_requests >= 1
    assert_serial_samples(tmp_path / "out", items, config)
    assert summary.replayed_chains == 0, "a lost replica is the coordinator's business, not the job's"


@pytest.mark.parametrize(
    "victim",
    [lambda job: job.chain_actors[0], lambda job: job.coordinator],
    ids=["chain-actor", "coordinator"],
)
def test_an_actor_killed_mid_stream_replays_to_the_same_samples(ray_address, tmp_path, victim):
    items, config = streaming_job(token_latency_s=0.01, chain_actors=2)
    killed = []

    def kill_mid_stream(row):
        if not killed:
            _wait_for_live_streams(job)
            ray.kill(victim(job), no_restart=False)
            killed.append(row)

    job = RayJob(items, config, tmp_path / "out")
    try:
        summary = job.run(on_sample=kill_mid_stream)
    finally:
        job.shutdown()
    assert killed and summary.replayed_chains >= 1
    assert_serial_samples(tmp_path / "out", items, config)


def test_two_coordinators_stream_through_one_replica(ray_address):
    """Each coordinator polls only its own streams: sharing a replica loses and aborts nothing."""
    from actors.cluster import SamplingCluster
    from actors.coordinator import start_coordinator
    from actors.stream_protocol import ChainActions
    from presto_ray.chain import Chain

    _, config = streaming_job(token_latency_s=0.002)
    with SamplingCluster(config.engine, config.ray) as cluster:
        other = start_coordinator(cluster.replicas, config.ray)
        try:
            chains = {c: Chain((5, 6, 7 + i), config.sampler.model_copy(update={"seed": i}), 0) for i, c in enumerate((cluster.coordinator, other))}
            refs = {c: c.stream_open.remote("x", 4) for c in chains}
            budgets = {c: ray.get(ref) for c, ref in refs.items()}
            starts = {c: tuple(chain.start_requests(budgets[c])) for c, chain in chains.items()}
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
