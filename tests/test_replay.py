"""A real engine replayed on a measured device (bench/replay.py), on the toy engine: the virtual
clock that resolves requests in batches gives the clock that resolves them one at a time, the
remembering engine computes each request once and charges the prefix cache a real engine would
have had, and `bench-real --chains --device-curve` reports virtual seconds with serial's samples."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from bench.replay import RememberingEngine, replayed
from presto_ray.cli import main
from presto_ray.config import SamplerConfig
from presto_ray.driver import sample_many
from presto_ray.engines.base import ProposalRequest
from presto_ray.engines.device_curve import DeviceCurve
from presto_ray.engines.toy import ToyEngine
from presto_ray.engines.virtual_clock import VirtualClockEngine

PEAKED = dict(vocab_size=48, eos_token_id=0, seed=5, logit_scale=4.0, eos_bias=-2.0)
CURVE = DeviceCurve(
    source="a test curve", batch_sizes=(1, 8, 32), step_time_s=(0.05, 0.07, 0.13),
    prefill_time_per_token_s=0.004, host_time_per_event_s=0.0005,
)  # fmt: skip
TOY_YAML = str(Path(__file__).resolve().parent.parent / "configs" / "toy.yaml")


class CountingToy(ToyEngine):
    def __init__(self) -> None:
        super().__init__(**PEAKED)
        self.calls: list[int] = []

    def generate(self, requests):
        self.calls.append(len(requests))
        return super().generate(requests)


@pytest.mark.parametrize("schedule", ["rounds", "streaming"])
@pytest.mark.parametrize("early_rejection", [False, True])
def test_resolving_in_batches_gives_the_clock_of_one_call_a_request(schedule, early_rejection):
    config = SamplerConfig(block_size=16, mh_steps=6, prefetch_budget=6, schedule=schedule, early_rejection=early_rejection)
    prompts = [[3, 4, 5 + c] for c in range(6)]
    configs = [config.model_copy(update={"seed": c}) for c in range(6)]
    runs = []
    for batches in (False, True):
        model = CountingToy()
        engine = VirtualClockEngine(model, device=CURVE, max_running=8, resolve_in_batches=batches)
        results, _ = sample_many(engine, prompts, configs)
        clock = engine.clock
        runs.append(([r.token_ids for r in results], [replace(r.stats, wall_time_s=0.0) for r in results], clock.time, clock.decode_steps,
                     clock.generated_tokens, clock.aborted_requests, engine.accounting(), model.calls))  # fmt: skip
    one_by_one, batched = runs
    assert batched[:7] == one_by_one[:7]
    assert set(one_by_one[7]) == {1} and max(batched[7]) > 1 and len(batched[7]) < len(one_by_one[7])


def test_an_unresolved_request_can_be_woken_bounded_and_aborted_before_it_runs():
    engine = VirtualClockEngine(ToyEngine(**PEAKED), resolve_in_batches=True)
    request = ProposalRequest((3, 4), (), 12, 0.25, seed=1, stop_at_eos=False)
    kept, dropped = engine.submit(request), engine.submit(ProposalRequest((3, 4), (), 12, 0.25, seed=2))
    engine.wake_at(kept, 5)
    assert engine.partial_tokens(kept) == () and engine.live_handles() == {kept, dropped} and engine.busy
    engine.abort(dropped)
    assert engine.clock.aborted_requests == 1 and engine.live_handles() == {kept}
    events = engine.advance()
    assert [(e.handle, e.generated, e.completion) for e in events] == [(kept, 5, None)]
    assert len(engine.partial_tokens(kept)) == 5


def test_the_remembering_engine_computes_a_request_once_and_keeps_a_prefix_cache():
    model = CountingToy()
    engine = RememberingEngine(model, cache_block_size=4)
    first = ProposalRequest(tuple(range(1, 11)), (), 6, 0.25, seed=1, stop_at_eos=False)
    out = engine.generate([first, first])
    assert model.calls == [1] and out.completions[0].token_ids == ToyEngine(**PEAKED).generate([first]).completions[0].token_ids
    child = ProposalRequest(first.prompt_token_ids, out.completions[0].token_ids[:3], 3, 0.25, seed=2, stop_at_eos=False)
    assert [c.cached_prompt_tokens for c in out.completions] == [0, 8]  # whole blocks short of the last token
    again = engine.generate([first, child])
    assert model.calls == [1, 1]  # only the child was computed
    # the child's context (13 tokens) runs into the first's completion, which the cache holds
    assert [c.cached_prompt_tokens for c in again.completions] == [8, 12]
    assert again.accounting.prompt_tokens == 23 and again.accounting.cached_prompt_tokens == 20
    with pytest.raises(ValueError, match="cache_block_size"):
        RememberingEngine(model, cache_block_size=0)


def test_a_replayed_engine_charges_the_curve_and_shares_the_engines_free_batch():
    model = ToyEngine(**PEAKED, speculation_batch=12)
    engine = replayed(model, CURVE, cache_block_size=16, max_running=32)
    assert engine.free_batch == 12 and engine.max_running == 32 and engine.device is CURVE
    results, _ = sample_many(engine, [[3, 4, 5]], [SamplerConfig(block_size=12, mh_steps=3, seed=1)])
    # at least every decode step at one sequence's cost, and every event's host time
    assert engine.clock.time >= engine.clock.decode_steps * 0.05 > 0 and results[0].token_ids


def test_bench_real_chains_on_a_device_curve_reports_virtual_seconds(tmp_path, capsys):
    curve = tmp_path / "curve.json"
    curve.write_text(CURVE.model_dump_json())
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n{"id": "b", "prompt": "Compute 17 * 23."}\n')
    out = tmp_path / "load.json"
    code = main([
        "bench-real", "--config", TOY_YAML, "--prompts", str(prompts), "--chains", "1,2", "--mh-steps", "3",
        "--block-size", "10", "--device-curve", str(curve), "--out", str(out),
    ])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    report = json.loads(out.read_text())
    assert report["config"]["clock"].startswith("virtual seconds") and report["config"]["repeats"] == 1
    assert report["config"]["device_curve"]["source"] == "a test curve" and report["samples_check"]["all_same"]
    rows = report["rows"]
    assert all(r["engine_steps"] and r["wall_time_s"] >= r["steps"] * 0.05 for r in rows)
    serial = [r for r in rows if r["setting"] == "serial"]
    assert [r["speedup_vs_serial"] for r in serial] == [1.0, 1.0]


def test_a_bad_device_curve_exits_2_naming_the_field(tmp_path, capsys):
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps({"source": "x", "batch_sizes": [1, 2], "step_time_s": [0.1]}))
    code = main(["bench-real", "--config", TOY_YAML, "--chains", "1", "--device-curve", str(curve)])
    assert code == 2
    assert "--device-curve" in capsys.readouterr().err


def test_the_device_curve_without_chains_exits_2_naming_it(tmp_path, capsys):
    curve = tmp_path / "curve.json"
    curve.write_text(CURVE.model_dump_json())
    assert main(["bench-real", "--config", TOY_YAML, "--device-curve", str(curve)]) == 2
    assert "--device-curve is the load bench's: give --chains too" in capsys.readouterr().err
