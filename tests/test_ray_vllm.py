"""The Ray Data batch job with a real vLLM replica (CPU, SmolLM2-135M), in rounds and streaming:
the in-process samples."""

from __future__ import annotations

import pytest

from presto_ray.job import JobConfig, run_job
from presto_ray.output import read_samples
from presto_ray.prompts import PromptItem
from vllm_settings import ENGINE

pytestmark = pytest.mark.vllm
ray = pytest.importorskip("ray")


def test_vllm_replica_under_ray_data_writes_the_in_process_samples(vllm_replicas, vllm_engine, tmp_path):
    """The Ray Data processor (issue 13) on one vLLM replica (the session's, shared with the Serve
    test): same samples as the in-process driver on the session's engine, and the chains of its
    stage actors share calls."""
    pytest.importorskip("ray.data")
    from deployments.processor import build_power_sampling_processor

    items = [
        PromptItem(id="capital", prompt="What is the capital of France? Answer in one word."),
        PromptItem(id="count", prompt="Count from one to five."),
    ]
    config = JobConfig.model_validate(
        {
            "engine": ENGINE,  # the engine the shared replica runs
            "sampler": {"block_size": 16, "num_blocks": 1, "mh_steps": 4, "prefetch_budget": 4, "seed": 3, "schedule": "rounds"},
            "chains_per_prompt": 2,
        }
    )
    expected = {(r["prompt_id"], r["chain"]): r for r in run_job(items, config, vllm_engine).rows}
    for schedule in ("rounds", "streaming"):  # one vLLM replica for both schedules
        job = config.model_copy(update={"sampler": config.sampler.model_copy(update={"schedule": schedule})})
        processor = build_power_sampling_processor(job, replicas=vllm_replicas, concurrency=2, batch_size=1)
        try:
            ds = ray.data.from_items([{"id": i.id, "prompt": i.prompt} for i in items])
            processor(ds).write_parquet(str(tmp_path / schedule))
            stats = processor.snapshot()
        finally:
            processor.shutdown()  # the coordinator; the replica stays with the session
        rows = read_samples(tmp_path / schedule).to_pylist()
        assert len(rows) == 4 and all(r["error"] is None for r in rows)
        for row in rows:
            want = expected[(row["prompt_id"], row["chain"])]
            assert row["token_ids"] == want["token_ids"], (schedule, row["prompt_id"])
            assert row["text"] == want["text"] and row["transitions"] == want["transitions"] == 4
        if schedule == "rounds":  # two stage actors, four chains: fewer calls than chain rounds
            assert stats.accounting.calls < sum(r["rounds"] for r in rows)
        else:
            assert stats.counters.streamed_requests > 0
