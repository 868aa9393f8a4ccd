"""bench-real's early-rejection option (bench/real.py), on the toy engine: every run off and on
side by side, the same samples, the stop figures, the common baseline; the KV-cache gauge reader
on a gauge like vLLM's. The run on vLLM itself is the bench (docs/benchmarks.md)."""

import json

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
