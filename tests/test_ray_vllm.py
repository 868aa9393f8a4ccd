"""The Ray batch job with a real vLLM replica (CPU, SmolLM2-135M): the in-process samples."""

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
    job = RayJob(items, config, tmp_path / "out")
    try:
        summary = job.run()
        stats = job.snapshot()
    finally:
        job.shutdown()
    rows = read_samples(tmp_path / "out").to_pylist()
    assert len(rows) == 4 and summary.samples == 4
    for row in rows:
        want = expected[(row["prompt_id"], row["chain"])]
        assert row["token_ids"] == want["token_ids"], row["prompt_id"]
        assert row["text"] == want["text"] and row["transitions"] == want["transitions"] == 4
    assert stats.accounting.calls < summary.chains.model_calls  # the four chains shared calls
    assert stats.accounting.scoring_tokens > 0  # log p0 came from vLLM's scoring pass inside the replica
