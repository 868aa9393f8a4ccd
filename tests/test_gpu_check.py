"""scripts/gpu_check.py cannot rot: its CPU check (--tiny: a randomly initialised 2-layer Qwen2,
one torch thread) runs as the GPU run would, in a subprocess, and what it writes is checked: every
curve is a valid DeviceCurve the virtual clock loads, the fits are there, and serial, rounds and
streaming with early rejection off and on gave the same token ids with MH steps that were not all
trivial. The saturation fits are checked on curves whose answer is known."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from transformers_helpers import TEST_THREADS, require_transformers

pytestmark = pytest.mark.transformers

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    require_transformers()
    out = tmp_path_factory.mktemp("gpu_check")
    env = {**os.environ, "OMP_NUM_THREADS": str(TEST_THREADS), "MKL_NUM_THREADS": str(TEST_THREADS)}
    env.pop("OUT", None)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--device", "cpu", "--threads", str(TEST_THREADS), "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, json.loads((out / "gpu_check_transformers.json").read_text()), done.stdout


def test_the_tiny_run_writes_curves_the_virtual_clock_loads(tiny_run):
    from presto_ray.engines.device_curve import DeviceCurve
    from presto_ray.engines.virtual_clock import VirtualClockEngine
    from presto_ray.engines.toy import ToyEngine

    out, report, stdout = tiny_run
    assert report["engine"] == "transformers" and report["model"]["dtype"] == "float32"
    assert report["machine"]["device"] == "cpu" and report["machine"]["torch_threads"] == TEST_THREADS
    contexts = report["curve"]["contexts"]
    assert list(contexts) == ["32", "64"]
    for context, entry in contexts.items():
        batches = [p["batch"] for p in entry["points"]]
        assert batches == [1, 2, 4, 8, 16]  # nothing trimmed at the tiny size
        for kind in ("forward", "engine_step"):
            curve = DeviceCurve.load(out / entry["files"][kind])
            assert curve.batch_sizes == tuple(batches)
            assert all(t > 0 for t in curve.step_time_s)
            assert curve.prefill_time_per_token_s > 0 and curve.host_time_per_event_s > 0
            fit = entry[f"fit_{kind}"]
            assert fit["lone_step_s"] == curve.step_time_s[0]
            assert fit["roofline"]["n_sat"] > 0 and fit["two_segment"]["knee"] >= 1
        # the engine's step is the forward and more, point by point
        assert all(p["engine_step_s"] >= p["forward_s"] for p in entry["points"])
        engine = VirtualClockEngine(ToyEngine(vocab_size=16, eos_token_id=0), device=DeviceCurve.load(out / entry["files"]["forward"]))
        assert engine.step_time(8) == pytest.approx(entry["points"][3]["forward_s"])
    assert "Decode step at context 32" in stdout and "Serial vs rounds vs streaming" in stdout


def test_the_tiny_run_gives_every_schedule_the_serial_samples(tiny_run):
    _, report, _ = tiny_run
    section = report["schedules"]
    rows = section["rows"]
    assert {(r["schedule"], r["early_rejection"]) for r in rows} == {
        (s, on) for s in ("serial", "rounds", "streaming") for on in (False, True)
    }
    assert report["checks"]["same_samples"] is True
    assert all(r["same_as_serial"] and r["same_on_off"] for r in rows)
    runs = section["per_prompt"]
    serial = [r["token_ids"] for r in runs["serial/off"]]
    assert serial and all(0 < len(ids) <= section["config"]["block_size"] for ids in serial)
    for key, measured in runs.items():
        assert [r["token_ids"] for r in measured] == serial, key
    # the logits were scaled so that MH steps are not all trivial: some accepted, some rejected
    acceptance = rows[0]["acceptance_rate"]
    assert 0 < acceptance < 1
    assert report["model"]["logits"]["after"]["c_std"] == pytest.approx(1.0, rel=1e-3)


def test_the_saturation_fits_find_a_known_knee():
    fit = _script().fit_saturation
    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    roofline = fit(sizes, [0.01 * max(1, n / 32) for n in sizes])
    assert roofline["batch_at_2x_lone"] == pytest.approx(64)
    assert roofline["roofline"]["n_sat"] == pytest.approx(32, rel=0.01) and not roofline["roofline"]["beyond_range"]
    assert roofline["two_segment"]["knee"] == pytest.approx(32, rel=0.02)
    assert roofline["two_segment"]["b_s_per_sequence"] == pytest.approx(0.01 / 32, rel=0.02)
    flat = fit(sizes, [0.01] * len(sizes))
    assert flat["batch_at_2x_lone"] is None and flat["roofline"]["beyond_range"]
    assert flat["two_segment"]["b_s_per_sequence"] == pytest.approx(0, abs=1e-12)


def test_the_command_line_refuses_what_it_cannot_run():
    parse = _script().parse_args
    with pytest.raises(SystemExit):
        parse(["--batch-sizes", "2,4"])  # no lone step to take ratios against
    with pytest.raises(SystemExit):
        parse(["--parts", "curve,speed"])
    args = parse(["--tiny"])
    assert args.batch_sizes == [1, 2, 4, 8, 16] and args.contexts == [32, 64]
    assert parse([]).batch_sizes == [1, 2, 4, 8, 16, 32, 64, 128, 256] and parse([]).contexts == [256, 1024]
