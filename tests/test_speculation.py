"""The streaming budget under load: a chain's share of the device's free batch, never below one."""

import math

from presto_ray import SamplerConfig
from presto_ray.driver import sample_many
from presto_ray.engines.toy import ToyEngine
from presto_ray.speculation import free_batch, streaming_budget


def test_free_batch_is_where_a_step_costs_three_lone_steps_capped_by_the_device():
    assert free_batch(1.0, 1 / 16, None) == 32
    assert free_batch(1.0, 1 / 16, 8) == 8
    assert free_batch(1.0, 0.0, 64) == 64
    assert math.isinf(free_batch(1.0, 0.0, None))


def test_chains_share_the_free_batch_and_keep_their_needed_request():
    assert streaming_budget(8, 1, math.inf) == 8  # an idle GPU-like device: the whole budget
    assert streaming_budget(8, 1, 16) == 8
    assert streaming_budget(8, 8, 16) == 2
    assert streaming_budget(8, 64, 64) == 1  # saturated: every chain runs only what it needs
    assert streaming_budget(8, 100, 16) == 1


def test_the_budget_shrinks_when_the_device_is_full():
    toy = ToyEngine(vocab_size=32, logit_scale=4.0, eos_bias=-3.0, seed=1)
    config = SamplerConfig(block_size=16, mh_steps=6, prefetch_budget=8, fixed_length=True, schedule="streaming")
    prompts = [[4, 5, 6 + c] for c in range(8)]
    configs = [config.model_copy(update={"seed": c}) for c in range(8)]
    serial, _ = sample_many(toy, prompts, [c.model_copy(update={"traversal": "serial", "schedule": "rounds"}) for c in configs])
    live = {}
    for max_running in (None, 8):
        engine = toy.streaming(max_running=max_running)
        streamed, _ = sample_many(engine, prompts, configs)
        assert [r.token_ids for r in streamed] == [r.token_ids for r in serial]
        live[max_running] = engine.clock.max_live
    assert live[None] > 32  # a free device: 8 chains keep many requests each
    assert live[8] <= 16  # 8 slots: one each (plus a needed request started beside a running guess)
