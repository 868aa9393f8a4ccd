"""Exact early rejection in every schedule: the samples are those without it, step for step; it
fires where it must; an engine that stops requests wrongly costs work, never the law (the exact
law with it on: test_exact_law.py)."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from presto_ray import SamplerConfig
from presto_ray.driver import sample_many
from presto_ray.chain import Chain
from presto_ray.rounds import ChainRounds
from presto_ray.driver import run_chain
from presto_ray.engines.base import EngineOutput, ProposalRequest
from presto_ray.engines.toy import ToyEngine
from presto_ray.engines.virtual_clock import VirtualClockEngine
from presto_ray.streaming import run_streaming
from identity_helpers import CONFIG_FIELDS, assert_same_walk, engines, run_recorded

SCHEDULES = {
    "serial": {"traversal": "serial", "schedule": "rounds"},
    "rounds": {"traversal": "predictive", "schedule": "rounds"},
    "bfs-rounds": {"traversal": "bfs", "schedule": "rounds"},
    "streaming": {"traversal": "predictive", "schedule": "streaming"},
}
# Peaked like an LLM: most proposals are rejected, many of them early.
PEAKED = dict(vocab_size=48, eos_token_id=0, seed=5, logit_scale=4.0, eos_bias=-2.0)


def _run(engine, prompt, config) -> Chain:
    """One chain to the end on `engine` (rounds) or on its streaming form (streaming)."""
    chain = Chain(prompt, config, engine.eos_token_id, record_edges=True)
    if config.schedule == "streaming":
        run_streaming(engine.streaming(), [chain])
    else:
        run_chain(engine, chain)
    return chain


on_off_configs = st.fixed_dictionaries(
    {**CONFIG_FIELDS, "alpha": st.sampled_from([2.0, 4.0]), "schedule_name": st.sampled_from(list(SCHEDULES))}
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(on_off_configs, engines, st.lists(st.integers(1, 11), max_size=4))
def test_on_and_off_walk_the_same_chain(config_kwargs, engine_kwargs, prompt):
    """Every schedule, sampler, length mode: the same tokens, log p0, cuts and decisions."""
    engine = ToyEngine(**engine_kwargs)
    prompt = [t % engine_kwargs["vocab_size"] for t in prompt]
    kwargs = {k: v for k, v in config_kwargs.items() if k not in ("schedule_name", "early_rejection")}
    config = SamplerConfig(**kwargs, **SCHEDULES[config_kwargs["schedule_name"]])
    on = _run(engine, prompt, config.model_copy(update={"early_rejection": True}))
    off = _run(engine, prompt, config.model_copy(update={"early_rejection": False}))
    assert_same_walk(on, off)
    assert off.stats.early_stopped_requests == off.stats.early_rejected_steps == 0
    if config.traversal == "serial":  # the same requests, some stopped (prefetching may plan differently)
        assert on.stats.generated_tokens <= off.stats.generated_tokens
    if config.sampler == "multi_try":
        assert on.stats.early_stopped_requests == 0  # no bound: it runs as without


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("fixed_length", [True, False])
@pytest.mark.parametrize("sampler", ["power_mh", "entropy_cut"])
def test_it_fires_and_saves_tokens(schedule, fixed_length, sampler):
    engine = ToyEngine(**PEAKED)
    config = SamplerConfig(block_size=48, mh_steps=12, prefetch_budget=12, fixed_length=fixed_length, sampler=sampler, **SCHEDULES[schedule])
    prompts = [[3, 4, 5 + i] for i in range(4)]
    configs = [config.model_copy(update={"seed": i}) for i in range(4)]
    on, _ = sample_many(engine, prompts, configs)
    off, _ = sample_many(engine, prompts, [c.model_copy(update={"early_rejection": False}) for c in configs])
    assert [r.token_ids for r in on] == [r.token_ids for r in off]
    stopped = sum(r.stats.early_stopped_requests for r in on)
    assert stopped > 0 and sum(r.stats.early_rejected_steps for r in on) > 0
    assert sum(r.stats.early_stop_tokens_left for r in on) > 0
    assert sum(r.stats.generated_tokens for r in on) < sum(r.stats.generated_tokens for r in off)
    if fixed_length and schedule == "serial":  # one request per step, all of it known: the count is exact
        saved = sum(r.stats.generated_tokens for r in off) - sum(r.stats.generated_tokens for r in on)
        assert saved == sum(r.stats.early_stop_tokens_left for r in on)


def test_a_stopped_completion_is_a_prefix_of_the_full_one():
    engine = ToyEngine(**PEAKED)
    chain = Chain([3, 4, 5], SamplerConfig(block_size=48, mh_steps=4, traversal="serial", schedule="rounds", fixed_length=True), engine.eos_token_id)
    rounds = ChainRounds(chain)
    while not chain.done:
        planned = rounds.plan()
        requests = planned.requests
        completions = engine.generate(requests).completions
        for request, completion in zip(requests, completions):
            full = engine.generate([replace(request, rejection_bounds=())]).completions[0]
            assert full.finish_reason != "rejected"
            n = len(completion.token_ids)
            assert completion.token_ids == full.token_ids[:n]
            np.testing.assert_array_equal(completion.logp0, full.logp0[:n])
            assert completion.stopped_early == (n < len(full.token_ids))
        rounds.advance(planned, completions)
    assert chain.stats.early_stopped_requests > 0


def test_the_virtual_clock_frees_a_stopped_requests_slot():
    engine = ToyEngine(**PEAKED)
    config = SamplerConfig(block_size=48, mh_steps=12, traversal="serial", schedule="rounds", seed=2)
    clocks = {}
    for on in (True, False):
        device = engine.streaming()
        run_chain(device, Chain([3, 4, 5], config.model_copy(update={"early_rejection": on}), engine.eos_token_id))
        clocks[on] = device.clock
    assert clocks[True].early_stopped_requests > 0 and clocks[False].early_stopped_requests == 0
    assert clocks[True].decode_steps < clocks[False].decode_steps  # serial: a stop is latency saved
    assert clocks[True].generated_tokens < clocks[False].generated_tokens


class StopsTooEarly:
    """An engine that stops every request carrying bounds after its first token, whether or not
    the bounds reject: the chain must notice, ask again, and keep the law."""

    def __init__(self, model: ToyEngine) -> None:
        self.model, self.eos_token_id, self.tokenizer = model, model.eos_token_id, model.tokenizer
        self.model_name, self.context_length = model.model_name, model.context_length
        self.free_batch = model.free_batch

    def generate(self, requests: list[ProposalRequest]) -> EngineOutput:
        output = self.model.generate(requests)
        cut = [c.truncated(1) if r.rejection_bounds and len(c.token_ids) > 1 else c for r, c in zip(requests, output.completions)]
        return EngineOutput(cut, output.accounting)

    def streaming(self) -> "StreamsStopTooEarly":
        return StreamsStopTooEarly(VirtualClockEngine(self.model))


class StreamsStopTooEarly:
    """The streaming form: a request whose bounds are set ends after its first token, whatever
    they say (its completion event comes when the engine would have ended it)."""

    def __init__(self, engine: VirtualClockEngine) -> None:
        self.engine, self.bounded = engine, set()

    def __getattr__(self, name):
        return getattr(self.engine, name)

    @property
    def busy(self):
        return self.engine.busy

    def submit(self, request, priority=0.0):
        handle = self.engine.submit(replace(request, rejection_bounds=()), priority)
        if request.rejection_bounds:
            self.bounded.add(handle)
        return handle

    def set_rejection_bounds(self, handle, bounds):
        (self.bounded.add if bounds else self.bounded.discard)(handle)

    def advance(self):
        return [
            replace(e, completion=e.completion.truncated(1))
            if e.completion is not None and e.handle in self.bounded and len(e.completion.token_ids) > 1
            else e
            for e in self.engine.advance()
        ]


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_a_wrong_stop_costs_a_second_request_never_the_law(schedule):
    toy = ToyEngine(**PEAKED)
    config = SamplerConfig(block_size=32, mh_steps=10, prefetch_budget=8, seed=1, **SCHEDULES[schedule])
    reference = run_recorded(toy, [3, 4, 5], config.model_copy(update={"early_rejection": False}))
    chain = _run(StopsTooEarly(toy), [3, 4, 5], config)
    assert_same_walk(chain, reference)
    assert chain.stats.early_stop_rerequests > 0


def test_a_colder_proposal_carries_no_bound():
    """tau < 1/alpha: g(t) may be positive, no bound holds, nothing is stopped."""
    engine = ToyEngine(**PEAKED)
    config = SamplerConfig(alpha=4.0, proposal_temperature=0.2, block_size=32, mh_steps=8, traversal="serial", schedule="rounds")
    chain = Chain([3, 4], config, engine.eos_token_id)
    assert all(not r.rejection_bounds for r in ChainRounds(chain).plan().requests)
    chain = run_recorded(engine, [3, 4], config)
    assert chain.stats.early_stopped_requests == 0
