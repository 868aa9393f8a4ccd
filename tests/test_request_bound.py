"""The HTTP service's bound on the tokens a request may generate (presto_ray/openai/work_bounds.py,
`request_token_bound`, serve.max_request_tokens) holds: chains run in process on the toy engine,
both schedules, every traversal and kernel, budgets from 1 up, fixed length and EOS, generate no
more tokens and issue no more requests than it allows."""

from __future__ import annotations

import itertools

import pytest

from presto_ray.config import SamplerConfig
from presto_ray.driver import sample
from presto_ray.engines.toy import ToyEngine
from presto_ray.openai.work_bounds import request_token_bound, requests_per_event

GRID = list(
    itertools.product(
        ["streaming", "rounds"],
        ["predictive", "bfs", "serial"],
        ["power_mh", "multi_try", "entropy_cut"],
        [1, 2, 6],  # prefetch budgets: the bound is tightest at 1 (one request per event)
        [(8, 1), (6, 2)],  # (block_size, num_blocks)
        [True, False],  # fixed length (no EOS ends a proposal early)
    )
)


@pytest.mark.parametrize(
    "schedule,traversal,sampler,budget,blocks,fixed_length",
    [case for case in GRID if not (case[2] == "multi_try" and case[1] != "serial" and case[3] < 4)],
)
def test_a_chain_generates_no_more_than_the_bound(schedule, traversal, sampler, budget, blocks, fixed_length):
    block_size, num_blocks = blocks
    config = SamplerConfig(
        block_size=block_size, num_blocks=num_blocks, mh_steps=8, prefetch_budget=budget, traversal=traversal,
        schedule=schedule, sampler=sampler, fixed_length=fixed_length, seed=11,
    )  # fmt: skip
    engine = ToyEngine(vocab_size=32, eos_token_id=0, seed=3, logit_scale=3.0, eos_bias=-2.0)
    stats = sample(engine, [4, 5, 6], config).stats
    events = config.num_blocks * (config.mh_steps + 1)
    assert 0 < stats.requests <= events * requests_per_event(config), (stats.requests, events)
    assert 0 < stats.generated_tokens <= request_token_bound(config, 1), (stats.generated_tokens, request_token_bound(config, 1))
    assert request_token_bound(config, 3) == 3 * request_token_bound(config, 1)
