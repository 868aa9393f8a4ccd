"""The streaming budget under load: a chain's share of the device's free batch, never below one."""

import math

import pytest

from presto_ray import SamplerConfig
from presto_ray.chain import Chain
from presto_ray.chain_stream import ChainStream, StreamEvent
from presto_ray.rounds import ChainRounds
from presto_ray.driver import sample_many
from presto_ray.engines.toy import ToyEngine
from presto_ray.speculation import budget_by_load, free_batch


def test_free_batch_is_where_a_step_costs_three_lone_steps_capped_by_the_device():
    assert free_batch(1.0, 1 / 16, None) == 32
    assert free_batch(1.0, 1 / 16, 8) == 8
    assert free_batch(1.0, 0.0, 64) == 64
    assert math.isinf(free_batch(1.0, 0.0, None))


def test_chains_share_the_free_batch_and_keep_their_needed_request():
    assert budget_by_load(8, 1, math.inf) == 8  # an idle GPU-like device: the whole budget
    assert budget_by_load(8, 1, 16) == 8
    assert budget_by_load(8, 8, 16) == 2
    assert budget_by_load(8, 64, 64) == 1  # saturated: every chain runs only what it needs
    assert budget_by_load(8, 100, 16) == 1


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


def test_the_speculation_threshold_falls_with_the_budget_and_is_capped():
    from presto_ray.speculation import MAX_SPECULATION_THRESHOLD, speculation_threshold

    assert speculation_threshold(8, 3.2) == pytest.approx(0.4)
    assert speculation_threshold(20, 3.2) == pytest.approx(0.16)
    assert speculation_threshold(16, 3.2) < speculation_threshold(8, 3.2)  # a larger budget speculates more
    assert speculation_threshold(4, 3.2) == speculation_threshold(1, 3.2) == MAX_SPECULATION_THRESHOLD
    assert speculation_threshold(8, 0.0) == 0.0  # off: the whole budget
    assert SamplerConfig().speculation_gain == 3.2  # on by default


def test_the_threshold_is_streamings_only_and_min_expected_gain_still_counts():
    """Rounds plan as before; a streaming chain starts fewer speculative requests with the rule on,
    and min_expected_gain raises the threshold, never lowers it."""
    toy = ToyEngine(vocab_size=32, logit_scale=4.0, eos_bias=-3.0, seed=1)
    base = SamplerConfig(block_size=24, mh_steps=8, prefetch_budget=8, fixed_length=True, schedule="streaming")

    def first_starts(**update):
        """Requests started right after the block's extension (before it the tree is one request)."""
        stream = ChainStream(Chain([4, 5, 6], base.model_copy(update=update), toy.eos_token_id))
        (extension,) = stream.step().starts
        completion = toy.generate([extension.request]).completions[0]
        return len(stream.step([StreamEvent(extension.key, completion=completion)]).starts)

    off, on = first_starts(speculation_gain=0.0), first_starts()
    assert 1 <= on < off == 8
    assert first_starts(min_expected_gain=0.9) <= on
    rounds = base.model_copy(update={"schedule": "rounds"})
    assert len(ChainRounds(Chain([4, 5, 6], rounds, toy.eos_token_id)).plan().requests) == len(
        ChainRounds(Chain([4, 5, 6], rounds.model_copy(update={"speculation_gain": 0.0}), toy.eos_token_id)).plan().requests
    )


class _CallSizes:
    """A batch engine that records how many requests each call carried."""

    def __init__(self, engine) -> None:
        self.engine, self.eos_token_id, self.free_batch, self.sizes = engine, engine.eos_token_id, engine.free_batch, []

    def generate(self, requests):
        self.sizes.append(len(requests))
        return self.engine.generate(requests)


def test_a_round_asks_for_its_share_of_the_free_batch():
    """Rounds share the device's free batch as streaming does (presto_ray/driver.py): 8 chains on
    a device of 8 slots ask one request each a round, a serial chain's; on a free device up to
    their whole budget. Either way the samples are the serial chain's."""
    toy = ToyEngine(vocab_size=32, logit_scale=4.0, eos_bias=-3.0, seed=1)
    config = SamplerConfig(block_size=16, mh_steps=6, prefetch_budget=8, fixed_length=True, schedule="rounds")
    prompts = [[4, 5, 6 + c] for c in range(8)]
    configs = [config.model_copy(update={"seed": c}) for c in range(8)]
    serial, _ = sample_many(toy, prompts, [c.model_copy(update={"traversal": "serial"}) for c in configs])
    largest = {}
    for max_running in (None, 8):
        engine = _CallSizes(toy.streaming(max_running=max_running))
        results, _ = sample_many(engine, prompts, configs)
        assert [r.token_ids for r in results] == [r.token_ids for r in serial]
        largest[max_running] = max(engine.sizes)
    assert largest[None] > 32, largest  # a free device: 8 chains ask many requests each
    assert largest[8] == 8, largest  # 8 slots: one each
