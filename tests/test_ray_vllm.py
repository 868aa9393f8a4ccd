"""The Ray batch job with a real vLLM replica (CPU, SmolLM2-135M), in rounds and streaming: the
in-process samples."""

from __future__ import annotations

import pytest

from presto_ray.job import JobConfig, run_job
from presto_ray.output import read_samples
from presto_ray.prompts import PromptItem

pytestmark = pytest.mark.vllm
ray = pytest.importorskip("ray")


def test_vllm_replica_on_ray_writes_the_in_process_samples(ray_address, vllm_engine, tmp_path):
    from deployments.batch_job import RayJob

    items = [
        PromptItem(id="capital", prompt="What is the capital of France? Answer in one word."),
        PromptItem(id="count", prompt="Count from one to five."),
    ]
    config = JobConfig.model_validate(
        {
            "sampler": {"block_size": 16, "num_blocks": 1, "mh_steps": 4, "prefetch_budget": 4, "seed": 3},
            "chains_per_prompt": 2,
        }
    )
    expected = {(r["prompt_id"], r["chain"]): r for r in run_job(items, config, vllm_engine).rows}
    streaming = config.model_copy(update={"sampler": config.sampler.model_copy(update={"schedule": "streaming"})})
    job = RayJob(items, config, tmp_path / "out")
    try:
        summary = job.run()
        stats = job.snapshot()
        # the same vLLM replica, chains streaming through a coordinator of their own
        stream_job = RayJob(items, streaming, tmp_path / "streamed", replicas=job.replicas)
        try:
            stream_summary = stream_job.run()
            stream_stats = stream_job.snapshot()
            live = ray.get([r.live_streams.remote() for r in job.replicas])
        finally:
            stream_job.shutdown()
    finally:
        job.shutdown()
    for out, run_summary in (("out", summary), ("streamed", stream_summary)):
        rows = read_samples(tmp_path / out).to_pylist()
        assert len(rows) == 4 and run_summary.samples == 4
        for row in rows:
            want = expected[(row["prompt_id"], row["chain"])]
            assert row["token_ids"] == want["token_ids"], (out, row["prompt_id"])
            assert row["text"] == want["text"] and row["transitions"] == want["transitions"] == 4
    assert stats.accounting.calls < summary.chains.model_calls  # the four chains shared calls
    assert stats.accounting.scoring_tokens > 0  # log p0 came from vLLM's scoring pass inside the replica
    assert stream_stats.accounting.calls == 0 and stream_stats.counters.streamed_requests > 0
    assert stream_stats.accounting.scoring_tokens > 0  # each proposal scored as it finished
    assert live == [0], "streams left running in the vLLM replica"
