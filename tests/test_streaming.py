"""The streaming schedule changes when requests run, never the trajectory: streaming == serial,
step for step; forks and aborts happen; an aborted request leaves nothing running."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from presto_ray import SamplerConfig
from presto_ray.chain import Chain
from presto_ray.chain_stream import ChainStream, StreamEvent
from presto_ray.driver import run_chain, sample, sample_many
from presto_ray.engines import ToyEngineConfig
from presto_ray.engines.toy import ToyEngine
from presto_ray.streaming import run_streaming
from identity_helpers import CONFIG_FIELDS, assert_same_walk, engines, run_recorded

# every traversal that prefetches, PowerMH (the one that forks) drawn twice as often
configs = st.fixed_dictionaries(
    {
        **CONFIG_FIELDS,
        "sampler": st.sampled_from(["power_mh", "power_mh", "entropy_cut", "multi_try"]),
        "traversal": st.sampled_from(["bfs", "predictive"]),
    }
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs, engines, st.lists(st.integers(1, 11), max_size=4))
def test_streaming_walks_the_serial_chain(config_kwargs, engine_kwargs, prompt):
    engine = ToyEngine(**engine_kwargs)
    prompt = [t % engine_kwargs["vocab_size"] for t in prompt]
    config = SamplerConfig(schedule="rounds", **config_kwargs)
    serial = run_recorded(engine, prompt, config.model_copy(update={"traversal": "serial"}))
    rounds = run_recorded(engine, prompt, config)
    streaming = run_recorded(engine, prompt, config.model_copy(update={"schedule": "streaming"}))
    for chain in (rounds, streaming):
        assert_same_walk(chain, serial)  # same cuts, same ratios, same decisions, step for step
        assert chain.stats.requests_used == serial.stats.requests_used  # the same proposals, fetched early
    # run_streaming itself refuses to return while a finished chain's book holds running requests


@pytest.mark.parametrize("fixed_length", [True, False])
def test_serial_streaming_is_the_serial_chain_on_the_clock(fixed_length):
    """traversal 'serial' streams one request at a time: the same decode steps as serial rounds."""
    toy = ToyEngine(vocab_size=32, logit_scale=4.0, eos_bias=-1.0, seed=2)
    config = SamplerConfig(block_size=16, mh_steps=8, seed=4, fixed_length=fixed_length, traversal="serial")
    clocks = {}
    for schedule in ("rounds", "streaming"):
        engine = toy.streaming()
        chain = Chain([3, 4], config.model_copy(update={"schedule": schedule}), toy.eos_token_id)
        run_chain(engine, chain)
        clocks[schedule] = engine.clock
        assert chain.stats.forked_requests == 0 and chain.stats.aborted_requests == 0
    assert clocks["rounds"].decode_steps == clocks["streaming"].decode_steps
    assert clocks["rounds"].generated_tokens == clocks["streaming"].generated_tokens


class RecordingEngine:
    """A VirtualClockEngine that checks every abort leaves the request out of its scheduler."""

    def __init__(self, engine):
        self.engine, self.aborted, self.wakes = engine, [], 0

    def __getattr__(self, name):
        return getattr(self.engine, name)

    @property
    def busy(self):
        return self.engine.busy

    def abort(self, handle):
        self.engine.abort(handle)
        assert handle not in self.engine.live_handles(), "an aborted request still runs"
        self.aborted.append(handle)

    def advance(self):
        events = self.engine.advance()
        self.wakes += sum(e.completion is None for e in events)
        return events


def test_forks_and_aborts_happen_and_aborted_requests_stop():
    toy = ToyEngine(vocab_size=64, logit_scale=4.0, eos_bias=-3.0, seed=1)
    config = SamplerConfig(block_size=48, mh_steps=24, prefetch_budget=12, seed=3, fixed_length=True, schedule="streaming")
    engine = RecordingEngine(toy.streaming())
    chain = Chain([5, 6, 7], config, toy.eos_token_id, record_edges=True)
    run_streaming(engine, [chain])
    serial = run_recorded(toy, [5, 6, 7], config.model_copy(update={"traversal": "serial", "schedule": "rounds"}))
    assert_same_walk(chain, serial)
    # this configuration forks and aborts (counts measured on it; any change of them is a change of behaviour)
    assert chain.stats.forked_requests > 0 and engine.wakes > 0
    assert chain.stats.aborted_requests == len(engine.aborted) > 0
    assert engine.clock.wasted_tokens > 0
    assert not engine.busy and not engine.live_handles()


def test_fork_wake_share_trades_events_for_nothing_but_the_schedule():
    """A higher fork_wake_share asks for fewer fork points (each an event and a plan) and the walk
    is the serial chain's at every share (share 0 asks for every fork point the plan has:
    tests/test_chain_stream.py)."""
    toy = ToyEngine(vocab_size=64, logit_scale=4.0, eos_bias=-3.0, seed=1)
    base = SamplerConfig(block_size=48, mh_steps=24, prefetch_budget=12, seed=3, schedule="streaming")
    serial = run_recorded(toy, [5, 6, 7], base.model_copy(update={"traversal": "serial", "schedule": "rounds"}))
    fork_events = {}
    for share in (0.0, 0.25, 1.0):
        config = base.model_copy(update={"fork_wake_share": share})
        chains = [Chain([5, 6, 7], config, toy.eos_token_id, record_edges=True) for _ in range(3)]
        engine = RecordingEngine(toy.streaming())
        run_streaming(engine, chains)
        for chain in chains:
            assert_same_walk(chain, serial)
        fork_events[share] = engine.wakes
    assert fork_events[0.0] > fork_events[0.25] > fork_events[1.0] > 0, fork_events


def test_plan_min_reach_plans_fewer_nodes_and_walks_the_serial_chain(monkeypatch):
    """A plan that leaves improbable events unexpanded is smaller, and the walk is the serial
    chain's at every threshold (which nodes it leaves: tests/test_plan_cache.py)."""
    from presto_ray.plan_cache import PlanCache

    toy = ToyEngine(vocab_size=64, logit_scale=4.0, eos_bias=-3.0, seed=1)
    base = SamplerConfig(block_size=48, mh_steps=24, prefetch_budget=16, seed=3, schedule="streaming")
    serial = run_recorded(toy, [5, 6, 7], base.model_copy(update={"traversal": "serial", "schedule": "rounds"}))
    sizes: list[int] = []
    real_tree = PlanCache.tree

    def counted(self, *args, **kwargs):
        tree = real_tree(self, *args, **kwargs)
        sizes.append(self._last_tree_nodes)
        return tree

    monkeypatch.setattr(PlanCache, "tree", counted)
    mean_nodes = {}
    for min_reach in (0.0, 0.01, 0.05):
        sizes.clear()
        config = base.model_copy(update={"plan_min_reach": min_reach})
        chains = [Chain([5, 6, 7], config, toy.eos_token_id, record_edges=True) for _ in range(3)]
        run_streaming(RecordingEngine(toy.streaming()), chains)
        for chain in chains:
            assert_same_walk(chain, serial)
        mean_nodes[min_reach] = sum(sizes) / len(sizes)
    assert mean_nodes[0.0] > mean_nodes[0.01] > mean_nodes[0.05] > 0, mean_nodes


def test_a_chain_takes_what_landed_in_one_advance_in_one_step(monkeypatch):
    """The driver hands each chain all its events of one engine advance together (they landed at
    the same instant): one step and one plan for them, as the Ray driver does; the walk is the
    serial chain's."""
    toy = ToyEngine(vocab_size=64, logit_scale=4.0, eos_bias=-3.0, seed=1)
    config = SamplerConfig(block_size=48, mh_steps=24, prefetch_budget=12, seed=3, schedule="streaming")
    serial = run_recorded(toy, [5, 6, 7], config.model_copy(update={"traversal": "serial", "schedule": "rounds"}))
    engine = RecordingEngine(toy.streaming())
    advances = [0]
    handed: list[tuple[int, int, int]] = []  # (advance, chain, events handed in one step)
    real_advance, real_step = engine.advance, ChainStream.step

    def counting_advance():
        advances[0] += 1
        return real_advance()

    def recording_step(self, events=(), budget=None):
        events = list(events)
        if events:
            handed.append((advances[0], id(self), len(events)))
        return real_step(self, events, budget)

    engine.advance = counting_advance
    monkeypatch.setattr(ChainStream, "step", recording_step)
    chains = [Chain([5, 6, 7], config, toy.eos_token_id, record_edges=True) for _ in range(3)]
    run_streaming(engine, chains)
    for chain in chains:
        assert_same_walk(chain, serial)
    steps_per_advance = [(advance, chain) for advance, chain, _ in handed]
    assert len(steps_per_advance) == len(set(steps_per_advance)), "a chain stepped twice in one advance"
    assert max(count for _, _, count in handed) > 1  # this configuration lands several at once


def test_sample_and_sample_many_stream_on_the_toy():
    spec = ToyEngineConfig(vocab_size=32, logit_scale=3.0, eos_bias=-1.0)
    engine = spec.build()
    configs = [SamplerConfig(block_size=12, num_blocks=2, mh_steps=6, prefetch_budget=6, seed=s, schedule="rounds") for s in range(4)]
    prompts = [[4, 5, 6 + s] for s in range(4)]
    rounds, _ = sample_many(engine, prompts, configs)
    streamed, accounting = sample_many(engine, prompts, [c.model_copy(update={"schedule": "streaming"}) for c in configs])
    assert [r.token_ids for r in streamed] == [r.token_ids for r in rounds]
    assert accounting.num_requests == sum(r.stats.requests for r in streamed)
    assert sample(engine, prompts[0], configs[0].model_copy(update={"schedule": "streaming"})).token_ids == rounds[0].token_ids
    with pytest.raises(ValueError, match="one schedule"):
        sample_many(engine, prompts[:2], [configs[0], configs[1].model_copy(update={"schedule": "streaming"})])


def test_a_request_the_engine_refuses_fails_its_chain_with_the_engines_reason():
    from presto_ray.chain_stream import StreamRequestError

    engine = ToyEngineConfig(vocab_size=32, logit_scale=3.0).build()
    config = SamplerConfig(block_size=12, num_blocks=2, mh_steps=6, prefetch_budget=6, schedule="streaming")
    # token 99 is past the toy's vocabulary: its model refuses the request when it computes it
    with pytest.raises(StreamRequestError, match="IndexError"):
        sample_many(engine, [[4, 5, 6], [4, 5, 99]], [config, config.model_copy(update={"seed": 1})])


def test_requests_below_a_step_waiting_for_its_fork_point_start_now():
    """A step whose cut lies beyond what the running proposal has generated is pending: its request
    starts at the fork point, and the plan goes on below it. A later step whose cut falls in the
    tokens that exist has the same prefix on both of the pending step's branches (fixed length),
    so its request starts now, not after the pending step is walked."""
    toy = ToyEngine(vocab_size=64, logit_scale=4.0, eos_bias=-3.0, seed=1)
    known = 20
    for seed in range(50):
        config = SamplerConfig(block_size=96, mh_steps=10, prefetch_budget=20, speculation_gain=0.0, seed=seed,
                               fixed_length=True, schedule="streaming")  # fmt: skip
        stream = ChainStream(Chain([5, 6, 7], config, toy.eos_token_id))
        cuts = [stream.planner._planned_cut(step, 96) for step in range(10)]
        if cuts[0] > known and any(c < known for c in cuts[1:]):
            break
    else:
        raise AssertionError("no seed with a first cut beyond the known tokens and a later one inside")
    (extension,) = stream.step().starts
    assert extension.key[0] == 0  # the block's first generation
    partial = tuple(toy.generate([extension.request]).completions[0].token_ids[:known])
    actions = stream.step([StreamEvent(extension.key, partial=partial)])
    # the first pending step's fork point unlocks the next request (other steps may wait too)
    assert [w for w in actions.wakes if w[0] == extension.key] == [(extension.key, min(c for c in cuts if c > known))]
    started = {start.key[:2] for start in actions.starts}
    inside = {(1 + step, partial[:cut]) for step, cut in enumerate(cuts) if cut < known}
    assert inside and inside <= started, (cuts, sorted(k[0] for k in started))
    # the pending step itself has no request yet: its prefix does not exist
    assert not any(key[0] == 1 for key in started)


def test_the_driver_collects_less_while_it_runs_and_restores_the_collector():
    """run_streaming raises the cyclic collector's thresholds for its loop (host time: full passes
    over every chain's kept plan nodes) and puts back what it found, also when the loop fails."""
    import gc

    from presto_ray.streaming import COLLECTION_THRESHOLDS, collecting_less

    before = gc.get_threshold()
    seen = []

    class OneIdleStep:  # busy for one advance, which records the thresholds the loop runs with
        free_batch = float("inf")
        calls = 0

        @property
        def busy(self):
            return self.calls == 0

        def advance(self):
            self.calls += 1
            seen.append(gc.get_threshold())
            return []

    chain = Chain([3], SamplerConfig(block_size=4, mh_steps=0, schedule="streaming"), 0)
    chain.done = True  # nothing to start: the loop runs once and ends
    run_streaming(OneIdleStep(), [chain])
    assert len(seen) == 1 and all(now >= wanted for now, wanted in zip(seen[0], COLLECTION_THRESHOLDS))
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError):
        with collecting_less():
            raise RuntimeError("the loop failed")
    assert gc.get_threshold() == before
