"""The Ray batch job on a real local Ray cluster: same samples as the in-process driver, merged
calls, recovery from dead chain actors and replicas, resumable sharded output."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from presto_ray.engines import build_engine
from presto_ray.job import JobConfig, run_job
from presto_ray.output import read_samples
from presto_ray.prompts import PromptItem

ray = pytest.importorskip("ray")

from deployments.batch_job import RayJob  # noqa: E402


def toy_job(prompts: int = 4, chains: int = 2, **ray_settings) -> tuple[list[PromptItem], JobConfig]:
    items = [PromptItem(id=f"q{i}", prompt=f"question number {i}: what follows?") for i in range(prompts)]
    config = JobConfig.model_validate(
        {
            "engine": {"kind": "toy", "vocab_size": 48, "logit_scale": 3.0, "eos_bias": -2.0},
            "sampler": {"block_size": 12, "num_blocks": 2, "mh_steps": 6, "prefetch_budget": 6, "seed": 11, "schedule": "rounds"},
            "chains_per_prompt": chains,
            "ray": ray_settings,
        }
    )
    return items, config


def by_pair(rows) -> dict:
    return {(r["prompt_id"], r["chain"]): r for r in rows}


def reference(items, config) -> dict:
    return by_pair(run_job(items, config, build_engine(config.engine)).rows)


SAMPLE_FIELDS = ("seed", "token_ids", "text", "finished_with_eos", "transitions", "accepted", "config")


def assert_same_samples(rows, expected: dict) -> None:
    got = by_pair(rows)
    assert len(got) == len(rows), "a (prompt, chain) pair was written twice"
    assert got.keys() == expected.keys()
    for pair, row in got.items():
        for field in SAMPLE_FIELDS:
            assert row[field] == expected[pair][field], (pair, field)


def run(items, config, out, **callbacks):
    job = RayJob(items, config, out)
    try:
        summary = job.run(**callbacks)
        return summary, job.snapshot()
    finally:
        job.shutdown()


@pytest.mark.parametrize(
    "settings",
    [
        {"num_replicas": 1},
        {"num_replicas": 2, "coordinator_shards": 2},
        {"num_replicas": 2, "replica_num_cpus": 0.5, "placement_strategy": "PACK"},
    ],
    ids=["1-replica", "2-replicas-2-coordinator-shards", "2-replicas-placement-group"],
)
def test_ray_job_writes_the_in_process_samples(ray_address, tmp_path, settings):
    items, config = toy_job(**settings)
    summary, stats = run(items, config, tmp_path / "out")
    assert_same_samples(read_samples(tmp_path / "out").to_pylist(), reference(items, config))
    assert summary.samples == len(items) * config.chains_per_prompt
    assert sum(stats.calls_per_replica) == stats.accounting.calls
    assert stats.shards == settings.get("coordinator_shards", 1)
    if settings["num_replicas"] == 2:  # with 2 shards each drives one replica: both shards served
        assert all(c > 0 for c in stats.calls_per_replica), "both replicas must serve calls"


def test_calls_merge_across_chains(ray_address, tmp_path):
    stats, transitions_per_call = {}, {}
    for chains in (1, 8):
        items, config = toy_job(prompts=1, chains=chains)
        summary, stats[chains] = run(items, config, tmp_path / f"out{chains}")
        assert stats[chains].accounting.calls <= summary.chains.model_calls
        transitions_per_call[chains] = summary.chains.transitions / stats[chains].accounting.calls
    eight = stats[8]
    chain_rounds_8 = sum(r["model_calls"] for r in read_samples(tmp_path / "out8").to_pylist())
    assert eight.accounting.calls < 0.4 * chain_rounds_8, "8 chains' rounds must share calls"
    assert eight.requests_per_call > 3 * stats[1].requests_per_call
    assert transitions_per_call[8] > 3 * transitions_per_call[1]


def test_prompt_affinity_keeps_a_prompt_on_one_replica(ray_address, tmp_path):
    items, config = toy_job(prompts=6, chains=2, num_replicas=2, affinity_slack=100_000)
    _, stats = run(items, config, tmp_path / "out")
    assert stats.counters.affinity_misses == 0
    assert all(c > 0 for c in stats.calls_per_replica)
    assert stats.cached_token_share > 0.5


def test_identical_requests_are_computed_once(ray_address):
    from actors.cluster import SamplingCluster
    from presto_ray.chain import Chain

    _, config = toy_job()
    with SamplingCluster(config.engine, config.ray) as cluster:
        plan = Chain((5, 6, 7), config.sampler, 0).plan()
        twins = ray.get([cluster.coordinator.submit.remote(chain, plan) for chain in ("a", "b")])
        stats = cluster.snapshot()
        assert [c.token_ids for c in twins[0]] == [c.token_ids for c in twins[1]]
        assert stats.counters.submitted_requests == 2 * len(plan)
        assert stats.counters.deduplicated == len(plan)
        assert stats.accounting.num_requests == len(plan)


@pytest.mark.parametrize(
    "victim",
    [
        lambda job: job.chain_actors[0],  # Ray restarts it; its chains are lost
        lambda job: job.coordinator,  # Ray restarts it; every waiting round is lost with it
    ],
    ids=["chain-actor", "coordinator"],
)
def test_a_killed_actor_restarts_and_its_chains_replay(ray_address, tmp_path, victim):
    items, config = toy_job(prompts=4, chains=2, chain_actors=2)
    config = config.model_copy(update={"engine": config.engine.model_copy(update={"call_latency_s": 0.05})})
    job = RayJob(items, config, tmp_path / "out")
    killed = []

    def kill_once(row):
        if not killed:
            ray.kill(victim(job), no_restart=False)
            killed.append(row)

    try:
        summary = job.run(on_sample=kill_once)
    finally:
        job.shutdown()
    assert summary.replayed_chains >= 1
    assert_same_samples(read_samples(tmp_path / "out").to_pylist(), reference(items, config))


@pytest.mark.parametrize("replicas", [1, 2], ids=["restarted-replica", "other-replica"])
def test_a_replica_killed_mid_call_has_its_requests_resent(ray_address, tmp_path, replicas):
    items, config = toy_job(prompts=4, chains=2, num_replicas=replicas)
    config = config.model_copy(update={"engine": config.engine.model_copy(update={"call_latency_s": 0.3})})
    job = RayJob(items, config, tmp_path / "out")
    killed = []

    def kill_during_a_call(row):
        if killed:
            return
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            busy = [i for i, n in enumerate(job.snapshot().inflight_calls_per_replica) if n]
            if busy:
                break
            time.sleep(0.01)
        ray.kill(job.replicas[busy[0]], no_restart=False)  # a call is running on it
        killed.append(row)

    try:
        summary = job.run(on_sample=kill_during_a_call)
        stats = job.snapshot()
    finally:
        job.shutdown()
    assert stats.counters.replica_failures >= 1 and summary.resent_requests >= 1
    assert_same_samples(read_samples(tmp_path / "out").to_pylist(), reference(items, config))


# A killed `sample --ray` job resuming: tests/test_ray_data.py (the CLI runs on Ray Data).


def test_resume_refuses_another_configuration(ray_address, tmp_path):
    items, config = toy_job(prompts=1, chains=1)
    run(items, config, tmp_path / "out")
    other = config.model_copy(update={"sampler": config.sampler.model_copy(update={"alpha": 2.0})})
    with pytest.raises(ValueError, match="another sampler configuration"):
        run(items, other, tmp_path / "out")


def test_sharded_output_is_read_as_one_table(ray_address, tmp_path):
    items, config = toy_job(prompts=3, chains=1, shard_rows=1)
    run(items, config, tmp_path / "out")
    shards = sorted(Path(tmp_path / "out").glob("part-*.parquet"))
    assert len(shards) == 3 and not list(Path(tmp_path / "out").glob(".*"))  # no temp files left
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "out").num_rows == 3


def test_cli_ray_sample_and_its_errors(ray_address, tmp_path, capsys):
    from presto_ray.cli import main

    config = Path(__file__).resolve().parent.parent / "configs" / "toy.yaml"
    out = tmp_path / "out"
    assert main(["sample", "--ray", "--config", str(config), "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote 8 rows to {out}/ (0 with an error)" in printed and "streamed requests" in printed  # toy.yaml streams
    assert len(read_samples(out)) == 8

    assert main(["sample", "--ray", "--config", str(config), "--out", str(out), "--seed", "5", "--quiet"]) == 2
    assert "another sampler configuration" in capsys.readouterr().err
    assert main(["sample", "--address", "127.0.0.1:1", "--config", str(config)]) == 2
    assert "--address needs --ray" in capsys.readouterr().err
    a_file = tmp_path / "file.parquet"
    a_file.write_text("")
    assert main(["sample", "--ray", "--config", str(config), "--out", str(a_file), "--quiet"]) == 2
    assert "is a file" in capsys.readouterr().err


def test_bench_ray_runs_and_checks_its_samples(ray_address, tmp_path):
    import json

    from bench.ray_throughput import format_report, run_ray_bench

    report = run_ray_bench(
        chain_counts=(2,), policy_chains=0, out_json=tmp_path / "ray.json", out_png=tmp_path / "ray.png",
        work_dir=tmp_path / "work", progress=lambda _: None,
    )
    (row,) = report["rows"]
    assert row["same_samples"] is True and row["ray_calls"] > 0 and row["share_of_engine"] > 0
    assert json.loads((tmp_path / "ray.json").read_text())["rows"][0]["chains"] == 2
    assert (tmp_path / "ray.png").stat().st_size > 0
    assert "trans/s" in format_report(report)


def test_coordinator_metrics_reach_the_prometheus_endpoint(ray_address, tmp_path):
    import httpx

    items, config = toy_job(prompts=2, chains=2)
    _, stats = run(items, config, tmp_path / "out")
    port = ray._private.worker.global_worker.node.metrics_export_port
    wanted = {
        "ray_presto_engine_calls_total", "ray_presto_engine_requests_total", "ray_presto_requests_per_call_count",
        "ray_presto_queue_depth", "ray_presto_chains_active", "ray_presto_cached_token_share",
        "ray_presto_transitions_total", "ray_presto_chain_rounds_total", "ray_presto_prompt_tokens_total",
    }  # fmt: skip
    deadline, samples = time.monotonic() + 90, {}
    while time.monotonic() < deadline:  # the metrics agent exports every few seconds
        lines = [line for line in httpx.get(f"http://127.0.0.1:{port}/metrics").text.splitlines() if line.startswith("ray_presto_")]
        samples = {}
        for line in lines:
            samples.setdefault(line.split("{")[0], []).append(float(line.rsplit(" ", 1)[1]))
        if wanted <= samples.keys() and sum(samples["ray_presto_engine_calls_total"]) >= stats.accounting.calls:
            break
        time.sleep(1)
    assert wanted <= samples.keys(), sorted(samples)
    assert sum(samples["ray_presto_engine_calls_total"]) >= stats.accounting.calls > 0


# --- resume keys, one writer, a one-line failure (issue 15 items 4 and 10) ------------------------
def test_resume_refuses_samples_whose_inputs_changed_and_a_second_live_writer(ray_address, tmp_path):
    items, config = toy_job(prompts=2, chains=1, shard_rows=1)
    out = tmp_path / "out"
    second_writer = []

    def try_a_second_writer(row):
        if not second_writer:
            with pytest.raises(ValueError, match="is being written by process") as caught:
                RayJob(items, config, out).run()
            second_writer.append(str(caught.value))

    run(items, config, out, on_sample=try_a_second_writer)
    assert second_writer and not list(out.glob(".*")), "the lock is released when the job ends"
    job = RayJob(items, config, out)
    assert job.pending_work() == ([], 2)  # same inputs: nothing to do
    assert {r["inputs"] for r in read_samples(out).to_pylist()} == set(job._inputs.values())
    edited = [items[0], PromptItem(id=items[1].id, prompt=items[1].prompt + " (edited)")]
    with pytest.raises(ValueError, match=rf"inputs changed.*{items[1].id}#0"):
        RayJob(edited, config, out).pending_work()
    other_model = config.model_copy(update={"engine": config.engine.model_copy(update={"seed": 7})})
    with pytest.raises(ValueError, match="inputs changed"):
        RayJob(items, other_model, out).pending_work()
    slower = config.model_copy(update={"engine": config.engine.model_copy(update={"call_latency_s": 0.01})})
    assert RayJob(items, slower, out).pending_work() == ([], 2)  # latency changes no sample
    more = items + [PromptItem(id="new", prompt="a new question")]
    work, skipped = RayJob(more, config, out).pending_work()
    assert [w.chain_id for w in work] == [("new", 0)] and skipped == 2


def test_a_coordinator_gone_for_good_ends_the_job_with_one_line(ray_address, tmp_path, monkeypatch):
    import deployments.batch_job as batch_job

    monkeypatch.setattr(batch_job, "COORDINATOR_RESTART_TIMEOUT_S", 2.0)
    items, config = toy_job(prompts=2, chains=2, coordinator_max_restarts=0)
    config = config.model_copy(update={"engine": config.engine.model_copy(update={"call_latency_s": 0.05})})
    job = RayJob(items, config, tmp_path / "out")

    def kill_coordinator(row):
        ray.kill(job.coordinator, no_restart=True)

    try:
        with pytest.raises(batch_job.JobFailed) as caught:
            job.run(on_sample=kill_coordinator)
    finally:
        job.shutdown()
    message = str(caught.value)
    assert "\n" not in message and "coordinator" in message and "rerun to resume" in message
    assert not list((tmp_path / "out").glob(".*")), "the lock is released when the job fails"


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
