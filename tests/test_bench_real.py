"""bench-real's early-rejection option (bench/real.py), on the toy engine: every run off and on
side by side, the same samples, the stop figures, the common baseline; the KV-cache gauge reader
on a gauge like vLLM's. The run on vLLM itself is the bench (docs/benchmarks.md)."""

import json
from pathlib import Path

import pytest

from bench.real import KVCachePeak, format_report, run_real_bench
from presto_ray.cli import main
from presto_ray.engines.toy import ToyEngine

# Peaked like an LLM: most proposals are rejected, many of them early (as in test_early_rejection_schedules.py).
PEAKED = dict(vocab_size=48, eos_token_id=0, seed=5, logit_scale=4.0, eos_bias=-2.0)


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    lines = [{"id": "a", "prompt": "What is the capital of France?"}, {"id": "b", "prompt": "Compute 17 * 23."}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_every_run_goes_off_and_on_with_the_same_samples(prompts, tmp_path):
    out = tmp_path / "er.json"
    report = run_real_bench(prompts, budgets=(4,), mh_steps=12, block_size=48, engine=ToyEngine(**PEAKED), out_json=out)
    rows = report["rows"]
    assert [(r["schedule"], r["traversal"], r["early_rejection"]) for r in rows] == [
        ("rounds", "serial", False), ("rounds", "serial", True),
        ("rounds", "predictive", False), ("rounds", "predictive", True),
        ("streaming", "predictive", False), ("streaming", "predictive", True),
    ]  # fmt: skip
    assert all(r["same_as_serial"] and r["same_on_off"] for r in rows)
    off, on = rows[0], rows[1]
    assert off["speedup_vs_serial_off"] == 1.0 and off["tokens_vs_serial_off"] == 1.0
    assert off["early_stopped_per_sample"] == 0 and off["early_stop_tokens_left_per_sample"] == 0
    for row in rows[1::2]:  # on: it fires, and saves tokens against the same schedule off
        assert row["early_stopped_per_sample"] > 0 and row["early_rejected_steps_per_sample"] > 0
    assert on["tokens_vs_serial_off"] < 1.0 and on["early_stop_tokens_left_per_sample"] > 0
    assert all(r["peak_kv_cache_usage"] is None for r in rows) and report["config"]["kv_cache_blocks"] is None  # the toy has no KV pool
    assert report["config"]["early_rejection"] == "both" and json.loads(out.read_text())["rows"] == rows
    assert "vs serial off" in format_report(report)


def test_one_setting_only(prompts):
    report = run_real_bench(prompts, budgets=(4,), mh_steps=6, block_size=24, engine=ToyEngine(**PEAKED),
                            early_rejection="on", num_prompts=1)  # fmt: skip
    rows = report["rows"]
    assert len(rows) == 3 and all(r["early_rejection"] for r in rows) and report["config"]["prompts"] == ["a"]
    assert all(r["speedup_vs_serial_off"] is None and r["same_on_off"] is None for r in rows)  # no baseline off
    assert rows[0]["speedup_vs_serial"] == 1.0 and all(r["same_as_serial"] for r in rows)
    header, _rule, *body = format_report(report).splitlines()
    table = [dict(zip(_cells(header), _cells(line))) for line in body]
    assert len(table) == 3
    for row in table:  # a figure without its baseline (serial off) or its gauge (the toy has no KV pool) is "-"
        assert row["tok vs serial off"] == "-" and row["peak KV"] == "-", row
        assert float(row["req/sample"]) > 0 and row["same as serial"] == "True", row
    with pytest.raises(ValueError, match="early_rejection"):
        run_real_bench(prompts, engine=ToyEngine(**PEAKED), early_rejection="yes")  # type: ignore[arg-type]


def _cells(line: str) -> list[str]:
    """A Markdown table line's cells."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_the_kv_peak_reads_every_value_of_vllms_gauge():
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    assert not KVCachePeak(registry).available  # no vLLM gauge there yet
    gauge = prometheus_client.Gauge("vllm:kv_cache_usage_perc", "KV-cache usage", labelnames=["engine"], registry=registry)
    child = gauge.labels(engine="0")
    child.set(0.9)  # before the tracker: not counted
    peak = KVCachePeak(registry)
    assert peak.available and peak.peak is None
    for value in (0.01, 0.07, 0.03):
        child.set(value)
    assert peak.peak == 0.07 and child._value.get() == 0.03  # the gauge itself still works
    peak.reset()
    child.set(0.02)
    assert peak.peak == 0.02
    peak.close()
    child.set(0.5)
    assert peak.peak == 0.02 and child._value.get() == 0.5


def test_the_option_is_checked():
    with pytest.raises(SystemExit):
        main(["bench-real", "--early-rejection", "sometimes"])


# --- bench-real --config: any job config's engine, through the command line ----------------------
TOY_YAML = str(Path(__file__).resolve().parent.parent / "configs" / "toy.yaml")
CONFIG_RUN = ["--block-size", "8", "--mh-steps", "2", "--n", "1", "--budgets", "4"]


def test_bench_real_runs_a_job_configs_engine_and_checks_its_samples(tmp_path, capsys):
    """configs/toy.yaml's engine, built as `presto-ray sample` builds it: serial, rounds and
    streaming, early rejection off and on; the report names the engine and the machine's load, and
    says every run gave serial's samples."""
    out = tmp_path / "toy.json"
    assert main(["bench-real", "--config", TOY_YAML, *CONFIG_RUN, "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    report = json.loads(out.read_text())
    config = report["config"]
    assert config["engine_kind"] == "toy" and config["engine"]["kind"] == "toy"
    assert config["engine"]["vocab_size"] == 64 and config["engine"]["eos_bias"] == -3.0  # toy.yaml's, not the defaults
    assert config["sampler"]["block_size"] == 8 and config["sampler"]["mh_steps"] == 2 and config["sampler"]["num_blocks"] == 1
    assert config["prompts"] == ["capital"] and config["prefix_cache"] is None  # the toy keeps no KV to empty
    rows = report["rows"]
    assert [(r["traversal"], r["schedule"], r["early_rejection"]) for r in rows] == [
        ("serial", "rounds", False), ("serial", "rounds", True),
        ("predictive", "rounds", False), ("predictive", "rounds", True),
        ("predictive", "streaming", False), ("predictive", "streaming", True),
    ]  # fmt: skip
    assert all(r["same_as_serial"] is True for r in rows)
    assert report["samples_check"]["all_same"] is True and report["samples_check"]["rows_compared"] == 6
    assert "samples: every run gave serial's samples token for token (6 runs x 1 prompt(s), toy engine)" in stdout
    machine = report["machine"]
    assert len(machine["load_average_start"]) == len(machine["load_average_end"]) == 3
    assert machine["cpu_count"] >= 1 and machine["bench_wall_time_s"] >= 0
    assert len(report["runs"]) == 6  # one per (run, setting) on the one prompt, in the order they ran
    for run, row in zip(report["runs"], rows):
        assert (run["schedule"], run["early_rejection"], run["prompt"]) == (row["schedule"], row["early_rejection"], "capital")
        assert run["wall_time_s"] == round(row["wall_time_s_per_sample"][0], 3) and run["load_1min_before"] >= 0
    assert (tmp_path / "toy.png").exists()  # beside --out, never over vLLM's plot


def test_bench_real_takes_the_configs_sampler_and_seed(tmp_path):
    """The job config's sampler gives alpha and the seed (T and K from the flags): another alpha
    is another chain, and serial's samples are still every schedule's."""
    text = Path(TOY_YAML).read_text()
    assert "alpha: 4.0" in text and "seed: 0" in text
    config = tmp_path / "toy_alpha2.yaml"
    config.write_text(text.replace("alpha: 4.0", "alpha: 2.0").replace("  seed: 0", "  seed: 7"))
    out = tmp_path / "a2.json"
    assert main(["bench-real", "--config", str(config), *CONFIG_RUN, "--early-rejection", "on", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["config"]["sampler"]["alpha"] == 2.0 and report["config"]["seed"] == 7
    assert report["samples_check"] == {**report["samples_check"], "all_same": True, "rows_compared": 3}


def test_the_samples_check_names_a_run_that_differs(prompts):
    """A row whose samples are not serial's makes the check fail and names it (the command then
    exits 1)."""
    from bench.real import format_samples_check, samples_check

    report = run_real_bench(prompts, budgets=(4,), mh_steps=2, block_size=8, engine=ToyEngine(**PEAKED), num_prompts=1)
    rows = [dict(r) for r in report["rows"]]
    assert samples_check(rows)["all_same"]
    rows[4]["same_as_serial"] = False  # streaming 4, early rejection off
    check = samples_check(rows)
    assert not check["all_same"] and check["rows_differing"] == ["power_mh streaming 4 early rejection off"]
    assert format_samples_check({**report, "samples_check": check}).startswith("samples: DIFFER from serial's in power_mh streaming 4")


def _write(path, text):
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "config, message",
    [
        (lambda tmp: str(tmp / "no-such.yaml"), "no-such.yaml: [Errno 2] No such file or directory"),
        (lambda tmp: _write(tmp / "bad.yaml", "engine:\n  kind: toy\n  vocab_size: 1\n"),
         "bad.yaml: invalid configuration: engine.toy.vocab_size:"),
        # valid YAML, valid fields: the toy engine refuses an EOS outside its vocabulary when built
        (lambda tmp: _write(tmp / "eos.yaml", "engine:\n  kind: toy\n  vocab_size: 8\n  eos_token_id: 8\n"),
         "eos.yaml: cannot build its toy engine: eos_token_id must be None or a token id below vocab_size"),
        # the transformers engine on a model folder that is not there
        (lambda tmp: _write(tmp / "hf.yaml", f"engine:\n  kind: transformers\n  model: {tmp / 'missing-model'}\n"),
         "hf.yaml: cannot build its transformers engine: model folder"),
    ],
    ids=["no-file", "invalid-field", "toy-cannot-build", "transformers-cannot-build"],
)
def test_a_config_that_cannot_give_an_engine_is_one_line_and_exit_2(tmp_path, capsys, config, message):
    path = config(tmp_path)
    out = tmp_path / "never.json"
    assert main(["bench-real", "--config", path, *CONFIG_RUN, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("presto-ray: error: ") and captured.err.count("\n") == 1, captured.err
    assert message in captured.err and "Traceback" not in captured.err, captured.err
    assert not out.exists()


def test_a_bad_config_path_exits_2_in_a_process_of_its_own(tmp_path):
    """The installed command: exit 2, one line on stderr, no traceback."""
    import subprocess
    import sys

    command = Path(sys.executable).with_name("presto-ray")
    done = subprocess.run([str(command), "bench-real", "--config", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "x.json")],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and "nope.yaml" in done.stderr and "Traceback" not in done.stderr, done.stderr
