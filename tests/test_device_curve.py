"""The measured device of the virtual clock: a decode-step curve, prefill and host costs."""

import json

import pytest
from pydantic import ValidationError

from presto_ray import SamplerConfig
from presto_ray.driver import sample_many
from presto_ray.engines.device_curve import DeviceCurve
from presto_ray.engines.toy import ToyEngine
from presto_ray.engines.virtual_clock import VirtualClockEngine

CURVE = DeviceCurve(source="test", batch_sizes=(1, 8, 32), step_time_s=(0.010, 0.012, 0.040))


def test_the_curve_interpolates_and_extends_its_last_segment():
    assert CURVE.step_time(1) == 0.010 and CURVE.step_time(8) == 0.012 and CURVE.step_time(32) == 0.040
    assert CURVE.step_time(20) == pytest.approx(0.012 + 12 * (0.028 / 24))
    assert CURVE.step_time(64) == pytest.approx(0.040 + 32 * (0.028 / 24))  # compute-bound: grows on
    assert DeviceCurve(source="flat", batch_sizes=(4,), step_time_s=(0.5,)).step_time(100) == 0.5
    # three lone steps (0.030) are reached between 8 and 32 sequences
    assert CURVE.free_batch() == min(n for n in range(1, 64) if CURVE.step_time(n) >= 0.030)


@pytest.mark.parametrize(
    "fields",
    [
        {"batch_sizes": (1, 8), "step_time_s": (0.1,)},
        {"batch_sizes": (8, 1), "step_time_s": (0.1, 0.2)},
        {"batch_sizes": (0, 8), "step_time_s": (0.1, 0.2)},
        {"batch_sizes": (1, 8), "step_time_s": (0.1, 0.0)},
    ],
)
def test_a_malformed_curve_is_refused(fields):
    with pytest.raises(ValidationError):
        DeviceCurve(source="bad", **fields)


def test_the_clock_charges_the_measured_step_prefill_and_host():
    toy = ToyEngine(vocab_size=16, eos_token_id=None, seed=1)
    curve = CURVE.model_copy(update={"prefill_time_per_token_s": 0.001, "host_time_per_event_s": 0.0005})
    engine = VirtualClockEngine(toy, device=curve)
    config = SamplerConfig(block_size=8, mh_steps=4, prefetch_budget=4, seed=2, traversal="serial", schedule="rounds", early_rejection=False)
    results, accounting = sample_many(engine, [[3, 4, 5]], [config])
    # serial: one request at a time, so every decode step costs the lone step
    uncached = accounting.prompt_tokens - accounting.cached_prompt_tokens
    completions = results[0].stats.requests
    expected = engine.clock.decode_steps * 0.010 + uncached * 0.001 + completions * 0.0005
    assert engine.clock.time == pytest.approx(expected)
    analytic = VirtualClockEngine(toy)
    assert sample_many(analytic, [[3, 4, 5]], [config])[0][0].token_ids == results[0].token_ids  # the device changes the clock, never the sample


def test_bench_reads_a_curve_file_and_refuses_a_bad_one(tmp_path, capsys):
    from presto_ray.cli import main

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"source": "x", "batch_sizes": [1, 2], "step_time_s": [0.1]}))
    assert main(["bench", "--virtual-clock", "--load-only", "--device-curve", str(bad), "--out", str(tmp_path / "v.json")]) == 2
    assert "step_time_s needs one time per batch size" in capsys.readouterr().err
