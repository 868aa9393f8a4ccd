"""The coordinator on a real local Ray cluster, with chains driven straight through it (no job):
calls merge across chains, identical requests run once, a prompt stays on its replica, a replica
killed mid-call or mid-stream has its requests re-sent with no sample changed, and the metrics reach
the node's Prometheus endpoint. (The job on Ray Data, and the stage actors' and coordinator's
failures under it: tests/test_ray_data.py.)"""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from actors.cluster import SamplingCluster  # noqa: E402
from ray_helpers import (  # noqa: E402
    InBackground,
    assert_same_samples,
    assert_serial_samples,
    drive_pairs,
    reference,
    toy_job,
    with_engine,
    with_sampler,
)
from waiting import wait_for  # noqa: E402


@pytest.fixture(scope="module")
def toy_replicas(ray_address):
    """One toy engine replica (the toy_job engine) for the module; each test starts its own
    coordinator on it (SamplingCluster with `replicas=`), so no test sees another's figures."""
    _, config = toy_job()
    cluster = SamplingCluster(config.engine, config.ray)
    yield cluster.replicas
    cluster.shutdown()


def test_calls_merge_across_chains(toy_replicas):
    stats, chain_rounds, transitions = {}, {}, {}
    for chains in (1, 8):
        # a round leaves once all 8 chains planned; the generous time bounds only keep a loaded
        # machine's pauses (a chain planning late) from splitting it
        items, config = toy_job(prompts=1, chains=chains, batch_window_s=1.0, max_batch_wait_s=3.0)
        with SamplingCluster(config.engine, config.ray, replicas=toy_replicas) as cluster:
            rows, _ = drive_pairs(cluster, items, config)
            stats[chains] = cluster.snapshot()
        assert_same_samples(rows, reference(items, config))
        chain_rounds[chains] = sum(r["rounds"] for r in rows)
        transitions[chains] = sum(r["transitions"] for r in rows) / stats[chains].accounting.calls
        assert stats[chains].accounting.calls <= chain_rounds[chains]
    print({"calls": {c: stats[c].accounting.calls for c in stats}, "chain_rounds": chain_rounds, "transitions_per_call": transitions})
    assert stats[8].accounting.calls < 0.4 * chain_rounds[8], "8 chains' rounds must share calls"
    assert stats[8].requests_per_call > 3 * stats[1].requests_per_call
    assert transitions[8] > 3 * transitions[1]


def test_identical_requests_are_computed_once(toy_replicas):
    from presto_ray.chain import Chain
    from presto_ray.rounds import ChainRounds

    _, config = toy_job()
    with SamplingCluster(config.engine, config.ray, replicas=toy_replicas) as cluster:
        plan = list(ChainRounds(Chain((5, 6, 7), config.sampler, 0)).plan().requests)
        twins = ray.get([cluster.coordinator.submit.remote(chain, plan) for chain in ("a", "b")])
        stats = cluster.snapshot()
    assert [c.token_ids for c in twins[0]] == [c.token_ids for c in twins[1]]
    assert stats.counters.submitted_requests == 2 * len(plan)
    assert stats.counters.deduplicated == len(plan)
    assert stats.accounting.num_requests == len(plan)


def test_prompt_affinity_keeps_a_prompt_on_one_replica_in_a_placement_group(ray_address):
    """Two replicas reserved together (PACK), each prompt routed to its replica: no miss, both
    serve calls, the prefix cache serves most prompt tokens, and the samples are the in-process ones."""
    items, config = toy_job(
        prompts=6, chains=2, num_replicas=2, affinity_slack=100_000, replica_num_cpus=0.5, placement_strategy="PACK"
    )
    with SamplingCluster(config.engine, config.ray) as cluster:
        assert cluster._placement_group is not None
        rows, _ = drive_pairs(cluster, items, config)
        stats = cluster.snapshot()
    assert_same_samples(rows, reference(items, config))
    assert stats.counters.affinity_misses == 0
    assert all(c > 0 for c in stats.calls_per_replica), "both replicas must serve calls"
    assert stats.cached_token_share > 0.5


def _busy_replica(cluster, schedule: str, timeout_s: float = 60.0) -> int:
    """Index of a replica with a call (rounds) or a request (streaming) running on it now."""

    def busy() -> list[int]:
        if schedule == "rounds":
            running = cluster.snapshot().inflight_calls_per_replica
        else:
            running = ray.get([replica.live_streams.remote() for replica in cluster.replicas])
        return [i for i, n in enumerate(running) if n]

    return wait_for(busy, timeout_s, "a call or request running on a replica", interval_s=0.005)[0]


def _live_streams(replicas, timeout_s: float = 60.0) -> list[int]:
    """Each replica's running requests, once the killed one is back (the job may end on the other
    replica while Ray is still restarting it)."""
    from ray.exceptions import ActorUnavailableError

    def answered() -> list[int] | None:
        try:
            return ray.get([replica.live_streams.remote() for replica in replicas])
        except ActorUnavailableError:
            return None

    return wait_for(answered, timeout_s, "every replica to answer (the killed one restarted)", interval_s=0.1)


@pytest.mark.parametrize("schedule", ["rounds", "streaming"])
@pytest.mark.parametrize("replicas", [1, 2], ids=["restarted-replica", "other-replica"])
def test_a_replica_killed_mid_call_has_its_requests_resent(ray_address, replicas, schedule):
    """Killed while it serves a call (rounds) or a streamed request: the coordinator re-sends its
    requests to the other replica or the restarted one; no chain notices, no sample changes."""
    items, config = toy_job(prompts=4, chains=2, num_replicas=replicas)
    latency = {"call_latency_s": 0.2} if schedule == "rounds" else {"token_latency_s": 0.004}
    config = with_sampler(with_engine(config, **latency), schedule=schedule)
    with SamplingCluster(config.engine, config.ray) as cluster:
        job = InBackground(lambda: drive_pairs(cluster, items, config))
        busy = _busy_replica(cluster, schedule)
        ray.kill(cluster.replicas[busy], no_restart=False)
        rows, _ = job.result()  # a chain that noticed the failure would raise here
        stats = cluster.snapshot()
        live = _live_streams(cluster.replicas)
    assert stats.counters.replica_failures >= 1 and stats.counters.resent_requests >= 1
    assert live == [0] * replicas, "no request may stay running in a replica"
    if schedule == "rounds":
        assert_same_samples(rows, reference(items, config))
    else:
        assert_serial_samples(rows, items, config)


def test_coordinator_metrics_reach_the_prometheus_endpoint(toy_replicas):
    """The coordinator's metrics and the chains' (from the actor that drives them) reach the node's
    metrics agent; the actor stays alive until they are seen."""
    import httpx

    items, config = toy_job(prompts=2, chains=2)

    @ray.remote(num_cpus=0)
    class ChainDriver:
        async def run(self, coordinators, prompt, chain_id, sampler):
            from actors.chain_driver import drive_chain
            from presto_ray.chain import Chain

            result = await drive_chain(coordinators.for_prompt(prompt), chain_id, Chain(prompt, sampler, 0))
            return result.token_ids

    from presto_ray.engines import build_tokenizer

    tokenizer = build_tokenizer(config.engine)
    with SamplingCluster(config.engine, config.ray, replicas=toy_replicas) as cluster:
        driver = ChainDriver.remote()
        prompts = [tuple(tokenizer.encode(item.prompt)) for item in items]
        for schedule in ("rounds", "streaming"):  # both schedules export what replicas spent
            sampler = config.sampler.model_copy(update={"schedule": schedule})
            ray.get([
                driver.run.remote(cluster.coordinators, p, (schedule, str(n), c), sampler.model_copy(update={"seed": c}))
                for n, p in enumerate(prompts) for c in range(config.chains_per_prompt)
            ])  # fmt: skip
        stats = cluster.snapshot()
        port = ray._private.worker.global_worker.node.metrics_export_port
        wanted = {
            "ray_presto_engine_calls_total", "ray_presto_engine_requests_total", "ray_presto_requests_per_call_count",
            "ray_presto_queue_depth", "ray_presto_chains_active", "ray_presto_cached_token_share",
            "ray_presto_transitions_total", "ray_presto_chain_rounds_total", "ray_presto_prompt_tokens_total",
            "ray_presto_generated_tokens_total", "ray_presto_stream_starts_total", "ray_presto_streams_running",
        }  # fmt: skip

        def complete(samples: dict) -> bool:
            return (
                wanted <= samples.keys()
                and sum(samples["ray_presto_engine_calls_total"]) >= stats.accounting.calls
                and sum(samples["ray_presto_stream_starts_total"]) >= stats.counters.streamed_requests
                and sum(samples["ray_presto_engine_requests_total"]) >= stats.accounting.num_requests
            )

        samples: dict[str, list[float]] = {}

        def exported() -> bool:
            lines = httpx.get(f"http://127.0.0.1:{port}/metrics").text.splitlines()
            samples.clear()
            for line in (line for line in lines if line.startswith("ray_presto_")):
                samples.setdefault(line.split("{")[0], []).append(float(line.rsplit(" ", 1)[1]))
            return complete(samples)

        try:  # the metrics agent exports every few seconds; the chains' actor lives until it has
            wait_for(exported, 90, f"the metrics agent to export {sorted(wanted)} up to the snapshot's figures", interval_s=1)
        finally:
            ray.kill(driver)
    assert wanted <= samples.keys(), sorted(samples)
    assert sum(samples["ray_presto_engine_calls_total"]) >= stats.accounting.calls > 0
    # streaming makes no calls, yet its requests and tokens are exported too (they were 0 before)
    assert sum(samples["ray_presto_stream_starts_total"]) >= stats.counters.streamed_requests > 0
    assert sum(samples["ray_presto_engine_requests_total"]) >= stats.accounting.num_requests > stats.accounting.calls
    assert sum(samples["ray_presto_generated_tokens_total"]) >= stats.accounting.generated_tokens > 0


def test_bench_coordinator_counts_every_request_through_each_shard_count(ray_address, tmp_path):
    import json

    from bench.coordinator_rate import format_report, run_coordinator_bench

    report = run_coordinator_bench((8,), (1, 2), duration_s=0.5, load_actors=2, out_json=tmp_path / "rate.json")
    assert [(r["shards"], r["chains"]) for r in report["rows"]] == [(1, 8), (2, 8)]
    # measure() checks the shards' summed snapshot counted exactly the requests the load sent
    assert all(r["requests"] > 0 and r["calls"] > 0 for r in report["rows"])
    assert report["rows"][0]["speedup"] == 1.0
    assert json.loads((tmp_path / "rate.json").read_text())["clock"] == "wall"
    assert "requests/s" in format_report(report)


def test_a_round_asks_for_its_share_of_the_replicas_free_batch(ray_address):
    """Through the coordinator as in process (tests/test_speculation.py): each rounds chain asks
    its share of the replicas' free batch. A replica whose free batch is 8 (the toy's
    `speculation_batch`) and 8 chains: one request each a round, as serial chains ask; a free
    one: up to the whole budget (6). The samples are the in-process run's either way."""
    items, config = toy_job(prompts=4, chains=2, batch_window_s=1.0, max_batch_wait_s=3.0)
    largest = {}
    for batch in (None, 8):
        loaded = with_engine(config, speculation_batch=batch)
        with SamplingCluster(loaded.engine, loaded.ray) as cluster:
            rows, _ = drive_pairs(cluster, items, loaded)
            largest[batch] = cluster.snapshot().counters.max_requests_per_call
        assert_same_samples(rows, reference(items, config))
    assert largest[8] <= 8 < largest[None], largest
