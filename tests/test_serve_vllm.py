"""The Serve application with a real vLLM replica (CPU, SmolLM2-135M), through the openai client."""

from __future__ import annotations

import pytest

from presto_ray.config import SamplerConfig
from presto_ray.driver import sample
from presto_ray.job import JobConfig
from presto_ray.keys import derive_seed
from vllm_settings import ENGINE

pytestmark = pytest.mark.vllm
LOGP0_TOLERANCE = 2e-3  # vLLM on the CPU against transformers, as tests/test_engine_conformance.py allows
ray = pytest.importorskip("ray")
openai = pytest.importorskip("openai")


def test_vllm_service_returns_the_in_process_sample(serve_base_url, vllm_replicas, vllm_engine, hf_reference):
    """The service over the session's vLLM replica (shared with the Ray Data test: the pool serves
    the replicas it is given), answered through the openai client."""
    from ray import serve

    from deployments.serve_app import app_for

    config = JobConfig.model_validate({"engine": ENGINE, "sampler": {"mh_steps": 3, "prefetch_budget": 4}})
    serve.run(app_for(config, replicas=vllm_replicas), name="vllm", route_prefix="/vllm")
    try:
        c = openai.OpenAI(base_url=f"{serve_base_url}/vllm/v1", api_key="none", max_retries=0, timeout=300)
        assert [m.id for m in c.models.list().data] == ["SmolLM2-135M-Instruct"]
        prompt = "The capital of France is"
        response = c.completions.create(model="SmolLM2-135M-Instruct", prompt=prompt, max_tokens=12, n=2, seed=4, logprobs=0)
        ids = vllm_engine.tokenizer.encode_raw(prompt)
        assert response.usage.prompt_tokens == len(ids)
        assert response.usage.model_extra["power_sampling"]["generated_tokens"] > response.usage.completion_tokens
        for choice in response.choices:
            sampler = SamplerConfig.model_validate(
                {**config.sampler.model_dump(), "block_size": 12, "num_blocks": 1, "seed": derive_seed(4, choice.index)}
            )
            expected = sample(vllm_engine, ids, sampler)
            assert choice.text == vllm_engine.tokenizer.decode(expected.token_ids)
            assert choice.model_extra["power_sampling"]["transitions"] == 3
            # the returned log p0 against transformers on the same weights (an independent model run)
            reference_logp0, _ = hf_reference(ids, expected.token_ids, 1.0)
            assert choice.logprobs.token_logprobs == pytest.approx(list(reference_logp0), abs=LOGP0_TOLERANCE)

        messages = [{"role": "user", "content": "Say hello."}]
        chat = c.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, max_tokens=8, seed=2)
        sampler = SamplerConfig.model_validate({**config.sampler.model_dump(), "block_size": 8, "seed": derive_seed(2, 0)})
        expected = sample(vllm_engine, vllm_engine.tokenizer.apply_chat_template(messages), sampler)
        assert chat.choices[0].message.content == vllm_engine.tokenizer.decode(expected.token_ids)

        too_long = c.with_options(max_retries=0).completions
        with pytest.raises(openai.BadRequestError, match="context"):
            too_long.create(model="SmolLM2-135M-Instruct", prompt="word " * 3000, max_tokens=8)
    finally:
        serve.delete("vllm")
    # the pool served the replica it was given and left it running (del runs on the pool's shutdown)
    assert ray.get(vllm_replicas[0].ready.remote(), timeout=30)
