"""The multi-chain local driver in rounds: chains share calls, samples do not change."""

from presto_ray import SamplerConfig, sample
from presto_ray.driver import sample_many
from presto_ray.engines.toy import ToyEngine


def test_many_chains_share_calls_and_keep_their_samples():
    engine = ToyEngine(vocab_size=32, eos_token_id=0, seed=5, logit_scale=3.0, eos_bias=-2.0)
    prompts = [[1, 2, i] for i in range(6)]
    configs = [SamplerConfig(block_size=16, num_blocks=2, mh_steps=12, prefetch_budget=6, seed=i, schedule="rounds") for i in range(6)]
    finished = []
    together, accounting = sample_many(engine, prompts, configs, on_result=lambda i, r: finished.append(i))
    alone = [sample(engine, p, c) for p, c in zip(prompts, configs)]
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert [r.stats.rounds for r in together] == [r.stats.rounds for r in alone]
    assert sorted(finished) == list(range(6))
    assert accounting.calls == max(r.stats.rounds for r in alone)  # every round merged
    assert accounting.num_requests == sum(r.stats.requests for r in alone)


def test_active_chain_limit_bounds_requests_per_call():
    engine = ToyEngine(vocab_size=16, eos_token_id=0, seed=1)
    configs = [SamplerConfig(block_size=8, mh_steps=4, prefetch_budget=2, seed=i, schedule="rounds") for i in range(5)]
    sizes = []
    original = engine.generate
    engine.generate = lambda requests: sizes.append(len(requests)) or original(requests)
    results, _ = sample_many(engine, [[3, 4]] * 5, configs, max_active_chains=2)
    assert max(sizes) <= 2 * 2
    assert [r.token_ids for r in results] == [sample(ToyEngine(vocab_size=16, eos_token_id=0, seed=1), [3, 4], c).token_ids for c in configs]


def test_streaming_bounds_the_chains_in_flight_and_commits_as_chains_finish():
    """Streaming honours max_active_chains (issue 34): with one chain at a time, chain i's requests
    are all that run, results arrive in input order, and the samples are the unbounded run's."""
    from presto_ray.engines.virtual_clock import VirtualClockEngine

    toy = ToyEngine(vocab_size=32, eos_token_id=0, seed=5, logit_scale=4.0, eos_bias=-2.0)
    configs = [SamplerConfig(block_size=16, mh_steps=8, prefetch_budget=4, seed=i, schedule="streaming") for i in range(5)]
    prompts = [[1, 2, i] for i in range(5)]
    finished: list[int] = []
    bounded = VirtualClockEngine(toy)
    one_at_a_time, _ = sample_many(bounded, prompts, configs, max_active_chains=1, on_result=lambda i, r: finished.append(i))
    unbounded = VirtualClockEngine(toy)
    all_at_once, _ = sample_many(unbounded, prompts, configs)
    assert [r.token_ids for r in one_at_a_time] == [r.token_ids for r in all_at_once]
    assert finished == list(range(5))
    assert bounded.clock.max_live <= 4 < unbounded.clock.max_live
