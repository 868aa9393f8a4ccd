"""Power sampling on the real engine: vLLM on the CPU with SmolLM2-135M."""

import pytest

from presto_ray import SamplerConfig, sample
from presto_ray.driver import sample_many

pytestmark = pytest.mark.vllm


def test_prefetching_reproduces_the_serial_chain_on_a_real_model(vllm_engine):
    prompt = vllm_engine.tokenizer.encode("Give me one tip for learning to cook.")
    for seed in (0, 1):
        results = {
            t: sample(vllm_engine, prompt, SamplerConfig(block_size=24, mh_steps=8, prefetch_budget=8, traversal=t, seed=seed))
            for t in ("serial", "bfs", "predictive")
        }
        serial = results["serial"]
        assert serial.stats.model_calls == serial.stats.transitions + serial.stats.extensions == 9
        for name in ("bfs", "predictive"):
            assert results[name].token_ids == serial.token_ids, (seed, name)
            assert results[name].stats.accepted == serial.stats.accepted
            assert results[name].stats.model_calls < serial.stats.model_calls
        assert vllm_engine.tokenizer.decode(serial.token_ids).strip()


def test_chains_share_calls_without_changing_samples(vllm_engine):
    tok = vllm_engine.tokenizer
    prompts = [tok.encode("Name a color."), tok.encode("Name an animal.")]
    configs = [SamplerConfig(block_size=16, mh_steps=4, prefetch_budget=4, seed=s) for s in (3, 4)]
    together, accounting = sample_many(vllm_engine, prompts, configs)
    alone = [sample(vllm_engine, p, c) for p, c in zip(prompts, configs)]
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert accounting.calls < sum(r.stats.model_calls for r in alone)
    assert accounting.cached_prompt_tokens > 0
