"""The toy's continuous-batching device in virtual time: exact decode-step arithmetic, priority,
abort, fork points."""

import pytest

from presto_ray.engines.base import ProposalRequest
from presto_ray.engines.device_curve import DeviceCurve
from presto_ray.engines.toy import ToyEngine
from presto_ray.engines.virtual_clock import VirtualClockEngine


def request(tokens: int, seed: int = 0) -> ProposalRequest:
    return ProposalRequest((1, 2), (), tokens, 1.0, seed, stop_at_eos=False)


def drain(engine) -> list:
    events = []
    while engine.busy:
        events += engine.advance()
    return events


def test_decode_steps_and_time_follow_the_cost_model():
    engine = ToyEngine(vocab_size=8, eos_token_id=None).streaming(step_cost=2.0, step_cost_per_sequence=0.5)
    engine.submit(request(3))
    engine.submit(request(5, seed=1))
    done = [e for e in drain(engine) if e.completion is not None]
    assert [len(e.completion.token_ids) for e in done] == [3, 5]
    # 3 steps with two sequences, then 2 with one
    assert engine.clock.decode_steps == 5 and engine.clock.generated_tokens == 8
    assert engine.clock.time == pytest.approx(3 * (2.0 + 0.5 * 2) + 2 * (2.0 + 0.5 * 1))


def test_completions_are_the_toys_own():
    toy = ToyEngine(vocab_size=8, eos_token_id=0, eos_bias=0.5)
    requests = [ProposalRequest((1, 2), (3,), 9, 0.5, seed) for seed in range(5)]
    assert [c.token_ids for c in toy.streaming().generate(requests).completions] == [
        c.token_ids for c in toy.generate(requests).completions
    ]


def test_waiting_requests_start_by_priority_and_an_abort_frees_a_slot():
    engine = ToyEngine(vocab_size=8, eos_token_id=None).streaming(max_running=1)
    first = engine.submit(request(4), priority=0.5)
    speculative = engine.submit(request(4, seed=1), priority=0.9)
    needed = engine.submit(request(2, seed=2), priority=0.0)
    order = [e.handle for e in drain(engine) if e.completion is not None]
    assert order == [first, needed, speculative]  # running work is not preempted; the queue is ordered

    engine = ToyEngine(vocab_size=8, eos_token_id=None).streaming(max_running=1)
    running = engine.submit(request(6))
    waiting = engine.submit(request(3, seed=1))
    engine.abort(running)
    assert engine.live_handles() == {waiting}
    assert [e.handle for e in drain(engine) if e.completion is not None] == [waiting]
    assert engine.clock.aborted_requests == 1 and engine.clock.decode_steps == 3


def test_a_fork_point_reports_partial_tokens_that_are_final():
    engine = ToyEngine(vocab_size=8, eos_token_id=None).streaming()
    handle = engine.submit(request(10))
    engine.wake_at(handle, 4)
    event = engine.advance()[0]
    assert event.completion is None and event.generated == 4
    partial = engine.partial_tokens(handle)
    final = drain(engine)[0].completion
    assert len(partial) == 4 and final.token_ids[:4] == partial
    assert engine.clock.decode_steps == 10  # waking cost no extra step


def test_a_fork_point_asked_after_the_request_passed_it_fires_at_once():
    """As vLLM's and the transformers engine's (base.StreamingEngine.wake_at): a chain asks for a
    fork point knowing only the tokens of its last event, so the request may be past it already."""
    engine = ToyEngine(vocab_size=8, eos_token_id=None).streaming()
    handle, other = engine.submit(request(10)), engine.submit(request(6, seed=1))
    engine.wake_at(other, 3)
    assert [(e.handle, e.generated) for e in engine.advance()] == [(other, 3)]  # `handle` is at 3 too
    steps = engine.clock.decode_steps
    engine.wake_at(handle, 2)
    assert [(e.handle, e.generated, e.completion) for e in engine.advance()] == [(handle, 3, None)]
    assert engine.clock.decode_steps == steps  # at once: no step taken for it
    engine.wake_at(handle, 10)  # its end: the completion tells it
    engine.wake_at(other, 0)  # nothing to wait for
    assert [e.handle for e in drain(engine) if e.completion is None] == []


def test_virtual_clock_bench_writes_rows_json_and_plot(tmp_path):
    import json

    from bench.virtual_clock import format_report, plot, run_virtual_clock_bench

    rows = run_virtual_clock_bench(budgets=(4,), mh_steps=(4, 6), chains=2, out_json=tmp_path / "v.json", progress=lambda _: None)
    keys = {"schedule", "prefetch_budget", "mh_steps", "fixed_length", "decode_steps", "serial_decode_steps",
            "generated_tokens", "serial_generated_tokens", "same_as_serial"}  # fmt: skip
    assert json.loads((tmp_path / "v.json").read_text()) == rows
    assert all(keys <= row.keys() and row["same_as_serial"] for row in rows)
    assert {row["schedule"] for row in rows} == {"serial", "rounds", "streaming"}
    plot(rows, tmp_path / "v.png")
    assert (tmp_path / "v.png").stat().st_size > 0 and "streaming" in format_report(rows)


def test_latency_bench_sets_streaming_beside_rounds_and_serial(tmp_path):
    import json

    from bench.virtual_clock import format_latency_report, run_latency_bench

    rows = run_latency_bench(mh_steps=4, settings=((4, None), (4, 0.0)), chains=2, out_json=tmp_path / "l.json", progress=lambda _: None)
    assert json.loads((tmp_path / "l.json").read_text()) == rows
    assert [(r["fixed_length"], r["prefetch_budget"], r["speculation_gain"], r["early_rejection"]) for r in rows] == [
        (fixed, 4, gain, early) for fixed in (True, False) for gain in (3.2, 0.0) for early in (False, True)
    ]  # fmt: skip
    for row in rows:
        assert row["same_as_serial"] and row["latency_vs_plain"] == row["decode_steps"] / row["horizon"]
        assert row["latency_vs_plain"] < row["serial_latency_vs_plain"]
    off, on = ({(r["fixed_length"], r["speculation_gain"]): r for r in rows if r["early_rejection"] == e} for e in (False, True))
    assert all(on[k]["serial_latency_vs_plain"] < off[k]["serial_latency_vs_plain"] for k in on)  # it stops proposals here
    assert "rounds x plain" in format_latency_report(rows)


def test_streaming_spends_no_more_tokens_than_rounds_at_the_same_budget_and_is_faster():
    """Issue 11's token target on one virtual-clock row (T = 96, K = 24, budget 8, fixed length, the
    bench's six chains): with speculation_threshold streaming generated 1.16x serial's tokens,
    rounds 1.26x; with speculation_gain = 0 streaming generated 1.45x, so this fails without it."""
    from bench.virtual_clock import ENGINES, _run
    from presto_ray.config import SamplerConfig

    base = SamplerConfig(block_size=96, mh_steps=24, prefetch_budget=8, fixed_length=True)
    totals = {}
    for schedule in ("rounds", "streaming"):
        runs = [_run(ENGINES[True], base.model_copy(update={"seed": c, "schedule": schedule}), [5, 6, 7 + c]) for c in range(6)]
        totals[schedule] = (sum(clock.generated_tokens for _, clock in runs), sum(clock.decode_steps for _, clock in runs))
    assert totals["streaming"][0] <= totals["rounds"][0]
    assert totals["streaming"][1] < totals["rounds"][1]


# --- a device that saturates ------------------------------------------------------------------
def saturating(n_sat: float, **costs):
    from presto_ray.engines.virtual_clock import VirtualClockEngine

    return VirtualClockEngine(ToyEngine(vocab_size=8, eos_token_id=None), saturation=n_sat, **costs)


@pytest.mark.parametrize(("running", "step"), [(1, 1.0), (8, 1.0), (32, 4.0)])
def test_a_saturating_step_costs_max_of_one_and_running_over_n_sat(running, step):
    engine = saturating(8, step_cost=1.0)
    assert engine.step_time(running) == step
    for seed in range(running):
        engine.submit(request(3, seed))
    drain(engine)
    assert engine.clock.decode_steps == 3 and engine.clock.time == pytest.approx(3 * step)
    free = ToyEngine(vocab_size=8, eos_token_id=None).streaming()  # n_sat = inf: the batch is free
    for seed in range(running):
        free.submit(request(3, seed))
    drain(free)
    assert free.clock.time == 3.0


def test_saturation_scales_the_step_cost_and_adds_to_a_cpu_like_slope():
    assert saturating(4, step_cost=2.0).step_time(12) == 6.0
    assert saturating(4, step_cost=1.0, step_cost_per_sequence=0.25).step_time(8) == 2.0 + 2.0
    with pytest.raises(ValueError, match="saturation"):
        saturating(0)


def test_the_free_batch_a_saturating_device_reports_is_its_saturation_point():
    assert saturating(32).free_batch == 32
    assert saturating(32, max_running=16).free_batch == 16
    assert saturating(32, step_cost_per_sequence=0.5).free_batch == 4  # the CPU-like rule binds first
    assert ToyEngine(vocab_size=8, eos_token_id=None).streaming().free_batch == float("inf")


def test_many_chains_take_longer_on_a_saturating_device_with_the_same_samples():
    from bench.virtual_clock_load import _load_run
    from presto_ray.config import SamplerConfig

    config = SamplerConfig(block_size=12, mh_steps=3, prefetch_budget=4, fixed_length=True)
    for update in ({"traversal": "serial"}, {"schedule": "streaming"}, {"schedule": "rounds"}):
        free = _load_run({}, config.model_copy(update=update), 12)
        sat = _load_run({"saturation": 4}, config.model_copy(update=update), 12)
        assert sat["time"] > free["time"] and sat["samples"] == free["samples"]
        if update.get("schedule") == "streaming":  # its share of a free batch of 4 among 12 chains: 1
            assert sat["tokens"] < free["tokens"] and sat["max_running"] <= 12
        elif update.get("schedule") == "rounds":  # the same share: a round asks one request a chain
            assert sat["tokens"] < free["tokens"]
        else:
            assert sat["tokens"] == free["tokens"]
    one_free, one_sat = _load_run({}, config, 1), _load_run({"saturation": 4}, config, 1)
    assert one_sat["time"] == one_free["time"]  # one chain's budget fits under n_sat


def test_load_bench_rows_carry_saturation_and_the_serial_samples(tmp_path):
    import json

    from bench.virtual_clock_load import format_load_report, plot_load, run_load_bench

    devices = {"free": {}, "sat": {"saturation": 3}}
    rows = run_load_bench(
        devices=devices, chain_counts={"free": (2,), "sat": (1, 6)}, budget=4, mh_steps=3, horizon=12,
        lengths=(False,), out_json=tmp_path / "load.json", progress=lambda _: None,
    )  # fmt: skip
    assert json.loads((tmp_path / "load.json").read_text()) == rows
    assert [(r["device"], r["chains"], r["schedule"], r["early_rejection"]) for r in rows][:6] == [
        ("free", 2, schedule, early) for schedule in ("serial", "rounds", "streaming") for early in (False, True)
    ]  # fmt: skip
    assert len(rows) == 18 and all(r["same_as_serial"] and not r["fixed_length"] for r in rows)
    serial_off = [r for r in rows if (r["schedule"], r["early_rejection"]) == ("serial", False)]
    assert all(r["throughput_vs_serial"] == 1.0 and r["tokens_vs_serial"] == 1.0 for r in serial_off)
    assert {r["device"]: r["saturation"] for r in rows} == {"free": "none", "sat": 3}
    keys = {"samples_per_kilostep", "tokens_per_sample", "tokens_vs_serial", "throughput_vs_serial"}
    assert all(keys <= r.keys() for r in rows)
    for r in rows:
        assert r["samples_per_kilostep"] == pytest.approx(1000 * r["chains"] / r["time"])
        assert r["tokens_per_sample"] == pytest.approx(r["generated_tokens"] / r["chains"])
    assert "n_sat" in format_load_report(rows)
    plot_load(rows, tmp_path / "load.png")
    assert (tmp_path / "load.png").stat().st_size > 0


# --- one model call per step: requests run from their submission, computed at the next advance --
PEAKED = dict(vocab_size=48, eos_token_id=0, seed=5, logit_scale=4.0, eos_bias=-2.0)
CURVE = DeviceCurve(
    source="a test curve", batch_sizes=(1, 8, 32), step_time_s=(0.05, 0.07, 0.13),
    prefill_time_per_token_s=0.004, host_time_per_event_s=0.0005,
)  # fmt: skip


class CountingToy(ToyEngine):
    def __init__(self) -> None:
        super().__init__(**PEAKED)
        self.calls: list[int] = []

    def generate(self, requests):
        self.calls.append(len(requests))
        return super().generate(requests)


class ComputedAtSubmission(VirtualClockEngine):
    """The reference: each request's completion computed as it is submitted, one model call each."""

    def submit(self, request, priority=0.0):
        handle = super().submit(request, priority)
        self._compute()
        return handle


@pytest.mark.parametrize("schedule", ["rounds", "streaming"])
@pytest.mark.parametrize("early_rejection", [False, True])
def test_one_model_call_per_step_gives_the_clock_of_computing_each_request_at_submission(schedule, early_rejection):
    from dataclasses import replace

    from presto_ray.config import SamplerConfig
    from presto_ray.driver import sample_many
    config = SamplerConfig(block_size=16, mh_steps=6, prefetch_budget=6, schedule=schedule, early_rejection=early_rejection)
    prompts = [[3, 4, 5 + c] for c in range(6)]
    configs = [config.model_copy(update={"seed": c}) for c in range(6)]
    runs = []
    for kind in (ComputedAtSubmission, VirtualClockEngine):
        model = CountingToy()
        engine = kind(model, device=CURVE, max_running=8)
        results, _ = sample_many(engine, prompts, configs)
        runs.append(([r.token_ids for r in results], [replace(r.stats, wall_time_s=0.0) for r in results], engine.clock,
                     engine.accounting(), model.calls))  # fmt: skip
    one_by_one, per_step = runs
    assert per_step[:4] == one_by_one[:4]  # samples, statistics, every clock figure, the accounting
    assert set(one_by_one[4]) == {1} and max(per_step[4]) > 1 and len(per_step[4]) < len(one_by_one[4])


def test_a_request_not_computed_yet_can_be_woken_bounded_and_aborted_as_a_computed_one():
    import math

    from presto_ray.early_rejection import RejectionBound

    stopping = (RejectionBound(alpha=4.0, log_accept_uniform=math.log(0.9), cut=4, current_weight=30.0, current_cut_log_prob=-3.0),)
    stopped_at = []

    def run(kind):
        engine = kind(ToyEngine(**PEAKED))
        kept = engine.submit(ProposalRequest((3, 4), (), 12, 0.25, seed=1, stop_at_eos=False))
        dropped = engine.submit(ProposalRequest((3, 4), (), 12, 0.25, seed=2))
        bounded = engine.submit(ProposalRequest((3, 4), (), 12, 0.25, seed=3, stop_at_eos=False))
        engine.wake_at(kept, 5)
        # asked in this order, the wake point lies past where the first bounds stop the request:
        # it is dropped then, and lifting the bounds does not bring it back
        engine.set_rejection_bounds(bounded, stopping)
        stopped_at.append(len(engine._find(bounded).completion.token_ids) if engine._find(bounded).completion else None)
        engine.wake_at(bounded, 6)
        engine.set_rejection_bounds(bounded, ())
        before = (engine.partial_tokens(kept), engine.live_handles() == {kept, dropped, bounded}, engine.busy)
        engine.abort(dropped)
        after_abort = (engine.clock.aborted_requests, engine.live_handles() == {kept, bounded})
        return before, after_abort, drain(engine), engine.clock, engine.accounting()

    reference, per_step = run(ComputedAtSubmission), run(VirtualClockEngine)
    assert stopped_at[0] is not None and stopped_at[0] < 6 and stopped_at[1] is None  # the case the order decides, computed late
    assert per_step == reference
    before, after_abort, events, clock, _ = per_step
    assert before == ((), True, True) and after_abort == (1, True)
    assert [(e.generated, e.completion is None) for e in events if e.handle == 0] == [(5, True), (12, False)]
    assert [e.generated for e in events if e.handle == 2] == [12]  # no event at 6: it was dropped when asked


def test_a_request_its_model_refuses_ends_at_the_next_step_with_the_models_error():
    engine = VirtualClockEngine(CountingToy(), max_running=1)
    refused = engine.submit(ProposalRequest(("not a token",), (), 8, 1.0, seed=1))  # the toy cannot hash it
    fine = engine.submit(ProposalRequest((5, 6), (), 8, 1.0, seed=1, stop_at_eos=False))
    aborted = engine.submit(ProposalRequest(("nor this",), (), 8, 1.0, seed=2))
    engine.abort(aborted)
    assert engine.live_handles() == {refused, fine}  # it runs from its submission, as every request
    first = engine.advance()
    assert [(e.handle, type(e.error)) for e in first] == [(refused, ValueError)]  # the aborted one just goes
    assert engine.live_handles() == {fine}  # its slot went to the waiting request
    events = drain(engine)
    assert [(e.handle, len(e.completion.token_ids)) for e in events] == [(fine, 8)]
    assert engine.model.calls == [3, 1, 1, 1] and engine.accounting().num_requests == 1


def test_a_request_of_no_tokens_ends_at_submission_and_a_refused_one_with_its_error():
    engine = VirtualClockEngine(ToyEngine(**PEAKED))
    empty = engine.submit(ProposalRequest((5, 6), (), 0, 1.0, seed=1))
    refused = engine.submit(ProposalRequest(("not a token",), (), 0, 1.0, seed=1))
    assert engine.live_handles() == set() and engine.busy  # neither ever runs
    events = engine.advance()
    assert [(e.handle, e.completion is not None and e.completion.token_ids == (), type(e.error)) for e in events] == [
        (empty, True, type(None)), (refused, False, ValueError)
    ]
    assert not engine.busy


def test_a_batch_call_with_a_request_its_model_refuses_fails_with_the_models_error():
    engine = VirtualClockEngine(ToyEngine(**PEAKED))
    fine = ProposalRequest((5, 6), (), 8, 1.0, seed=1, stop_at_eos=False)
    with pytest.raises(IndexError):
        engine.generate([fine, ProposalRequest((5, 999), (), 8, 1.0, seed=2)])  # 999: past the vocabulary
    assert engine.live_handles() == set() and not engine.busy
    assert [len(c.token_ids) for c in engine.generate([fine]).completions] == [8]  # the clock goes on
