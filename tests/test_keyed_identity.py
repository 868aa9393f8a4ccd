"""Prefetching changes the schedule, never the trajectory: serial == bfs == predictive (rounds here;
streaming in test_streaming.py)."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from presto_ray import SamplerConfig, sample
from presto_ray.engines.toy import ToyEngine
from identity_helpers import assert_same_walk, configs, engines, run_recorded


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs, engines, st.lists(st.integers(1, 11), max_size=4))
def test_every_traversal_walks_the_serial_chain(config_kwargs, engine_kwargs, prompt):
    engine = ToyEngine(**engine_kwargs)
    prompt = [t % engine_kwargs["vocab_size"] for t in prompt]
    chains = {t: run_recorded(engine, prompt, SamplerConfig(traversal=t, schedule="rounds", **config_kwargs)) for t in ("serial", "bfs", "predictive")}
    serial = chains["serial"]
    assert serial.stats.rounds == serial.stats.transitions + serial.stats.extensions
    for name in ("bfs", "predictive"):
        chain = chains[name]
        assert_same_walk(chain, serial)  # same cuts, same ratios, same decisions, step for step
        assert chain.stats.rounds <= serial.stats.rounds
        assert chain.stats.requests_used == serial.stats.requests_used  # the same proposals, fetched early


def test_prefetching_saves_most_calls_on_peaked_models():
    engine = ToyEngine(vocab_size=64, eos_token_id=0, seed=1, logit_scale=4.0, eos_bias=-3.0)
    results = {
        traversal: [
            sample(engine, [5, 6, seed], SamplerConfig(block_size=32, mh_steps=40, prefetch_budget=8, seed=seed, traversal=traversal, schedule="rounds"))
            for seed in range(6)
        ]
        for traversal in ("serial", "bfs", "predictive")
    }
    tokens = {t: [r.token_ids for r in rs] for t, rs in results.items()}
    assert tokens["bfs"] == tokens["serial"] and tokens["predictive"] == tokens["serial"]
    calls = {t: sum(r.stats.rounds for r in rs) for t, rs in results.items()}
    assert calls["bfs"] < 0.5 * calls["serial"], calls
    assert calls["predictive"] < 0.5 * calls["serial"], calls


def test_same_seed_same_sample_and_other_seeds_differ():
    engine = ToyEngine(vocab_size=16, eos_token_id=0, seed=2, logit_scale=1.0)
    config = SamplerConfig(block_size=16, mh_steps=5)
    first = sample(engine, [1, 2], config).token_ids
    assert sample(engine, [1, 2], config).token_ids == first
    others = {sample(engine, [1, 2], config.model_copy(update={"seed": s})).token_ids for s in range(1, 6)}
    assert len(others | {first}) > 1


def test_output_ends_with_eos_and_respects_horizon():
    engine = ToyEngine(vocab_size=6, eos_token_id=0, seed=3, eos_bias=1.0)
    for seed in range(20):
        config = SamplerConfig(block_size=5, num_blocks=2, mh_steps=3, seed=seed)
        tokens = sample(engine, [1], config).token_ids
        assert 1 <= len(tokens) <= 10
        assert 0 not in tokens[:-1]  # nothing after EOS leaks out
    fixed = SamplerConfig(block_size=5, num_blocks=2, mh_steps=3, fixed_length=True, seed=1)
    chain = run_recorded(engine, [1], fixed)
    assert len(chain.state.tokens) == 10  # fixed-length states always reach the horizon
