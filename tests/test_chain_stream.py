"""ChainStream.step, the streaming book's one entry, which both drivers call: whether events arrive one at a time
(the in-process driver) or a batch at a time (the Ray driver), the chain walks the serial
trajectory; each fork point is asked for once; errors and stale events are handled in one place."""

import pytest

from presto_ray import SamplerConfig
from presto_ray.chain import Chain
from presto_ray.engines.toy import ToyEngine
from presto_ray.chain_stream import ChainStream, StreamEvent, StreamRequestError
from identity_helpers import assert_same_walk, run_recorded

TOY = dict(vocab_size=64, logit_scale=4.0, eos_bias=-3.0, seed=1)


def _run_batched(engine, stream, check_wakes=None):
    """The Ray driver's shape on the virtual clock: every batch of engine events goes to the chain
    in one step. Checks that no fork point is asked for twice while its request runs;
    `check_wakes(stream, wakes, asked)`, where given, checks each step's wakes against the plan."""
    handles, keys, asked = {}, {}, set()
    actions = stream.step()
    while True:
        for key in actions.aborts:
            engine.abort(handles.pop(key))
            asked = {(k, n) for k, n in asked if k != key}  # a key started again asks afresh
        if actions.done:
            return
        for start in actions.starts:
            handles[start.key] = engine.submit(start.request, start.priority)
            keys[handles[start.key]] = start.key
        if check_wakes is not None:
            check_wakes(stream, actions.wakes, asked)
        for key, needed in actions.wakes:
            assert (key, needed) not in asked and stream.is_running(key)
            asked.add((key, needed))
            engine.wake_at(handles[key], needed)
        events = []
        for event in engine.advance():
            key = keys.get(event.handle)
            if key is None or handles.get(key) != event.handle:
                continue  # aborted
            if event.completion is not None:
                del handles[key]
                asked = {(k, n) for k, n in asked if k != key}
                events.append(StreamEvent(key, completion=event.completion))
            else:
                events.append(StreamEvent(key, partial=engine.partial_tokens(event.handle)))
        assert events or not engine.busy, "the engine went idle with the chain unfinished"
        actions = stream.step(events)


@pytest.mark.parametrize("fixed_length", [True, False])
@pytest.mark.parametrize("sampler", ["power_mh", "entropy_cut", "multi_try"])
def test_batched_events_walk_the_serial_chain(fixed_length, sampler):
    toy = ToyEngine(**TOY)
    extra = {"num_tries": 2} if sampler == "multi_try" else {}
    config = SamplerConfig(block_size=32, mh_steps=12, prefetch_budget=8, seed=3, fixed_length=fixed_length, sampler=sampler, schedule="streaming", **extra)
    chain = Chain([5, 6, 7], config, toy.eos_token_id, record_edges=True)
    engine = toy.streaming()
    stream = ChainStream(chain)
    _run_batched(engine, stream)
    serial = run_recorded(toy, [5, 6, 7], config.model_copy(update={"traversal": "serial", "schedule": "rounds"}))
    assert_same_walk(chain, serial)
    assert stream.running_requests == 0 and not engine.busy
    if sampler == "power_mh":
        assert chain.stats.forked_requests > 0 and chain.stats.aborted_requests > 0  # the step forks and aborts here


def test_share_0_asks_for_every_fork_point_of_the_plan():
    """fork_wake_share 0 (the schedule before the share): at every step, every fork point of a
    running request that the plan has and the chain has not asked for yet (tests/test_streaming.py:
    a higher share asks for fewer, with the same walk)."""
    toy = ToyEngine(**TOY)
    config = SamplerConfig(block_size=48, mh_steps=24, prefetch_budget=12, seed=3, schedule="streaming", fork_wake_share=0.0)
    stream = ChainStream(Chain([5, 6, 7], config, toy.eos_token_id))
    steps = []

    def check_wakes(stream, wakes, asked):
        tree = stream._plan()
        expected = {((*k, 0), n) for k, n in tree.fork_points.items() if stream.is_running((*k, 0))} - asked
        assert set(wakes) == expected
        steps.append(len(wakes))

    _run_batched(toy.streaming(), stream, check_wakes)
    assert sum(steps) > 0


def test_an_error_event_raises_and_a_stale_event_is_ignored():
    toy = ToyEngine(**TOY)
    chain = Chain([5, 6], SamplerConfig(block_size=16, mh_steps=4, prefetch_budget=4, seed=1, schedule="streaming"), toy.eos_token_id)
    stream = ChainStream(chain)
    first = stream.step()
    assert first.starts and not first.done and first.transitions == 0
    key = first.starts[0].key
    stale = stream.step([StreamEvent((99, (), 0), error="lost")])  # not a running request of this chain
    assert not stale.done and stream.is_running(key)
    with pytest.raises(StreamRequestError, match="refused: too long"):
        stream.step([StreamEvent(key, error="refused: too long")])


def test_a_finished_chain_aborts_what_runs_and_starts_nothing():
    toy = ToyEngine(**TOY)
    config = SamplerConfig(block_size=16, mh_steps=4, prefetch_budget=6, seed=2, schedule="streaming")
    chain = Chain([5, 6], config, toy.eos_token_id)
    stream = ChainStream(chain)
    actions = stream.step()
    completions = {}
    while not actions.done:
        completions.update((s.key, toy.generate([s.request]).completions[0]) for s in actions.starts)
        running = {key for key in completions if stream.is_running(key)}
        needed = min(running)  # deliver in any order: the walk waits for what it needs
        actions = stream.step([StreamEvent(needed, completion=completions.pop(needed))])
    assert actions.starts == () and actions.wakes == ()
    assert set(actions.aborts) == running - {needed}  # what still ran when the chain finished
    assert stream.running_requests == 0 and chain.done
