"""A real engine replayed on a measured device (bench/replay.py), on the toy engine: the
remembering engine computes each request once and charges the prefix cache a real engine would
have had, and `bench-real --chains --device-curve` reports virtual seconds with serial's samples.
(The clock's one model call per step: tests/test_virtual_clock.py.)"""

import json
from pathlib import Path

import pytest

from bench.replay import RememberingEngine, replayed
from presto_ray.cli import main
from presto_ray.config import SamplerConfig
from presto_ray.driver import sample_many
from presto_ray.engines.base import ProposalRequest
from presto_ray.engines.toy import ToyEngine
from test_virtual_clock import CURVE, PEAKED, CountingToy

TOY_YAML = str(Path(__file__).resolve().parent.parent / "configs" / "toy.yaml")


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
