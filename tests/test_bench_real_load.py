"""bench-real --chains (bench/real_load.py) on the toy engine: every setting at every number of
chains in flight, the same samples as serial, ratios from the recorded walls, repeats in
alternating order; the engine-step counter on a gauge like vLLM's; the command line's flags. The
run on vLLM itself is the bench (docs/benchmarks.md)."""

import hashlib
import json
import statistics
from pathlib import Path

import pytest

from bench.real import KVCachePeak
from bench.real_load import SETTINGS, format_report, format_samples_check, run_real_load_bench, samples_check
from presto_ray.cli import main
from presto_ray.engines.toy import ToyEngine
from presto_ray.job import prompt_seed

PEAKED = dict(vocab_size=48, eos_token_id=0, seed=5, logit_scale=4.0, eos_bias=-2.0)  # as tests/test_bench_real.py
NAMES = [name for name, *_ in SETTINGS]
TOY_YAML = str(Path(__file__).resolve().parent.parent / "configs" / "toy.yaml")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    lines = [{"id": "a", "prompt": "What is the capital of France?"}, {"id": "b", "prompt": "Compute 17 * 23."}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.fixture(scope="module")
def report(prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp("load") / "load.json"
    return run_real_load_bench(prompts, (1, 3), ToyEngine(**PEAKED), mh_steps=4, block_size=12, repeats=2, out_json=out)


def test_a_row_per_chain_count_and_setting_all_with_serials_samples(report):
    rows = report["rows"]
    assert [(r["chains"], r["setting"]) for r in rows] == [(c, name) for c in (1, 3) for name in NAMES]
    assert all(r["same_as_serial"] is True for r in rows)
    assert report["samples_check"]["all_same"] is True and report["samples_check"]["rows_compared"] == 12
    assert format_samples_check(report).startswith("samples: every setting gave serial's samples token for token")
    for row in rows:
        assert (row["traversal"], row["budget"]) == (("serial", 1) if row["setting"].startswith("serial") else ("predictive", 16))
        assert row["early_rejection"] == row["setting"].endswith("early rejection")
        assert row["generated_tokens"][0] == row["generated_tokens"][1] and row["tokens_same_across_repeats"]
        assert row["samples_per_second"] == pytest.approx(row["chains"] / row["wall_time_s"])
        assert row["engine_steps"] is None and row["tokens_per_step"] is None  # the toy has no vLLM gauge
    serial = rows[0]
    assert serial["speedup_vs_serial"] == 1.0 and serial["tokens_vs_serial"] == 1.0
    assert [r["setting"] for r in rows if r["is_default"]] == ["streaming + early rejection"] * 2  # SamplerConfig()'s
    config = report["config"]
    assert config["defaults"] == "streaming + early rejection" and config["engine_kind"] == "ToyEngine"
    assert config["engine_steps"] is None and config["prefix_cache"] is None
    assert config["sampler"]["num_blocks"] == 1 and config["sampler"]["block_size"] == 12
    text = format_report(report)
    assert "vs serial" in text and "engine steps" in text and len(text.splitlines()) == 2 + len(rows)


def test_the_speedups_come_from_the_recorded_walls_repeat_by_repeat(report):
    runs = report["runs"]

    def wall(chains, name, repeat):
        (run,) = [r for r in runs if (r["chains"], r["setting"], r["repeat"]) == (chains, name, repeat)]
        return run["wall_time_s"]

    row = next(r for r in report["rows"] if (r["chains"], r["setting"]) == (3, "rounds"))
    ratios = [wall(3, "serial", k) / wall(3, "rounds", k) for k in (0, 1)]
    assert row["speedup_vs_serial_per_repeat"] == pytest.approx(ratios)
    assert row["speedup_vs_serial"] == pytest.approx(statistics.median(ratios))
    assert row["wall_time_s_per_repeat"] == [wall(3, "rounds", 0), wall(3, "rounds", 1)]
    assert row["wall_time_s"] == pytest.approx(statistics.median(row["wall_time_s_per_repeat"]))


def test_repeats_alternate_the_order_and_chains_go_round_the_prompts(report):
    runs = report["runs"]
    assert len(runs) == 2 * 2 * len(SETTINGS)
    assert [(r["chains"], r["repeat"]) for r in runs[:12]] == [(1, 0)] * 6 + [(1, 1)] * 6
    assert [r["setting"] for r in runs[:12]] == NAMES + NAMES[::-1]  # A B ... B A
    assert [r["setting"] for r in runs[12:]] == NAMES + NAMES[::-1]
    for run in runs:
        assert run["engine_steps"] is None and run["load_1min_before"] >= 0 and run["generated_tokens"] > 0
    # three chains on two prompts: a0, b0, a1: every setting's samples hash alike
    assert len({r["samples_sha256"] for r in runs if r["chains"] == 3}) == 1


def test_the_third_chain_is_a_jobs_chain_one_of_the_first_prompt(prompts):
    """C = 3 on two prompts: chains a0, b0, a1, seeded prompt_seed(seed, id, chain) as a job seeds
    them; the run's digest is of all three chains' samples."""
    from presto_ray.config import SamplerConfig
    from presto_ray.driver import sample, sample_many

    engine = ToyEngine(**PEAKED)
    report = run_real_load_bench(prompts, (3,), engine, mh_steps=3, block_size=8, repeats=1, seed=4)
    serial = SamplerConfig(block_size=8, mh_steps=3, num_blocks=1, traversal="serial", prefetch_budget=1,
                           schedule="rounds", early_rejection=False)  # fmt: skip
    texts = ["What is the capital of France?", "Compute 17 * 23.", "What is the capital of France?"]
    seeds = [prompt_seed(4, "a", 0), prompt_seed(4, "b", 0), prompt_seed(4, "a", 1)]
    ids = [engine.tokenizer.encode(text) for text in texts]
    results, _ = sample_many(engine, ids, [serial.model_copy(update={"seed": s}) for s in seeds])
    assert results[2].token_ids == sample(engine, ids[0], serial.model_copy(update={"seed": seeds[2]})).token_ids
    assert results[2].token_ids != results[0].token_ids  # another chain on the same prompt, not a copy
    digest = hashlib.sha256(json.dumps([list(r.token_ids) for r in results]).encode()).hexdigest()
    assert report["runs"][0]["setting"] == "serial" and report["runs"][0]["samples_sha256"] == digest


def test_the_samples_check_can_fail(report, prompts, monkeypatch):
    rows = [dict(r) for r in report["rows"]]
    rows[10]["same_as_serial"] = False  # streaming at 3 chains
    check = samples_check(rows)
    assert not check["all_same"] and check["rows_differing"] == ["streaming at 3 chains"]
    assert format_samples_check({**report, "samples_check": check}) == "samples: DIFFER from serial's in streaming at 3 chains"

    # and from the run itself: a schedule that changed one chain's sample is caught
    import bench.real_load as real_load

    real = real_load.sample_many

    def tampered(engine, prompts, configs):
        results, accounting = real(engine, prompts, configs)
        if configs[0].schedule == "streaming" and not configs[0].early_rejection:
            results[0].token_ids = list(results[0].token_ids[:-1]) + [(results[0].token_ids[-1] + 1) % 48]
        return results, accounting

    monkeypatch.setattr(real_load, "sample_many", tampered)
    tampered_report = run_real_load_bench(prompts, (2,), ToyEngine(**PEAKED), mh_steps=2, block_size=8, repeats=1)
    assert tampered_report["samples_check"]["rows_differing"] == ["streaming at 2 chains"]
    assert [r["setting"] for r in tampered_report["rows"] if not r["same_as_serial"]] == ["streaming"]


def test_the_step_counter_counts_every_set_of_vllms_gauge():
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    assert KVCachePeak(registry).steps is None  # no gauge: no steps to count
    gauge = prometheus_client.Gauge("vllm:kv_cache_usage_perc", "KV-cache usage", labelnames=["engine"], registry=registry)
    child = gauge.labels(engine="0")
    child.set(0.9)  # before the tracker: not counted
    kv = KVCachePeak(registry)
    assert kv.steps == 0
    for value in (0.01, 0.07, 0.03, 0.03):  # the same value again is another step
        child.set(value)
    assert kv.steps == 4 and kv.peak == 0.07
    kv.reset()
    assert kv.steps == 0
    child.set(0.02)
    assert kv.steps == 1
    kv.close()
    child.set(0.5)
    assert kv.steps is None and child._value.get() == 0.5


def test_the_plot_is_written(report, tmp_path):
    pytest.importorskip("matplotlib")
    from bench.real_load import plot

    plot(report, tmp_path / "load.png")
    assert (tmp_path / "load.png").stat().st_size > 0


# --- the command line ------------------------------------------------------------------------------
def test_bench_real_chains_runs_a_job_configs_engine(tmp_path, capsys):
    out = tmp_path / "toy_load.json"
    argv = ["bench-real", "--config", TOY_YAML, "--chains", "1,2", "--repeats", "1", "--mh-steps", "2", "--block-size", "8"]
    assert main([*argv, "--n", "2", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    report = json.loads(out.read_text())
    config = report["config"]
    assert config["engine_kind"] == "toy" and config["engine"]["vocab_size"] == 64  # configs/toy.yaml's engine
    assert config["chain_counts"] == [1, 2] and config["repeats"] == 1 and config["prompts"] == ["capital", "arith"]
    assert config["sampler"]["prefetch_budget"] == 16 and config["defaults"] == "streaming + early rejection"
    assert [(r["chains"], r["setting"]) for r in report["rows"]] == [(c, name) for c in (1, 2) for name in NAMES]
    assert report["samples_check"]["all_same"] and "samples: every setting gave serial's samples" in stdout
    assert (tmp_path / "toy_load.png").exists()  # beside --out


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--chains", "0"], "--chains: every number of chains must be at least 1"),
        (["--chains", "x"], "--chains: expected comma-separated integers (e.g. 1,4,16,64), got 'x'"),
        (["--chains", "1,4", "--repeats", "0"], "--repeats: expected at least 1, got 0"),
        (["--chains", "1", "--variants"], "--variants is the one-chain bench's"),
        (["--chains", "1", "--early-rejection", "on"], "--early-rejection is the one-chain bench's"),
    ],
    ids=["zero", "not-a-number", "no-repeats", "variants", "early-rejection"],
)
def test_bad_chains_flags_exit_2_naming_the_flag(tmp_path, capsys, flags, message):
    out = tmp_path / "never.json"
    assert main(["bench-real", "--config", TOY_YAML, *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("presto-ray: error: ") and message in err and err.count("\n") == 1, err
    assert not out.exists()


def test_all_settings_add_streamed_serial_chains_with_serials_samples(prompts, tmp_path, capsys):
    """`--settings all`: serial chains streamed (each chain's next request as soon as its last
    ends) beside the standard rows, the same samples; serial must be among any settings given."""
    from bench.real_load import ALL_SETTINGS

    report = run_real_load_bench(prompts, (3,), ToyEngine(**PEAKED), mh_steps=3, block_size=8, repeats=1, settings=ALL_SETTINGS)
    rows = {r["setting"]: r for r in report["rows"]}
    assert list(rows) == [name for name, *_ in ALL_SETTINGS] and len(rows) == len(SETTINGS) + 2
    streamed = rows["serial streamed + early rejection"]
    assert (streamed["schedule"], streamed["traversal"], streamed["budget"]) == ("streaming", "serial", 1)
    assert all(r["same_as_serial"] for r in rows.values()) and report["samples_check"]["all_same"]
    assert [s["name"] for s in report["config"]["settings"]] == list(rows)
    with pytest.raises(ValueError, match="must include 'serial'"):
        run_real_load_bench(prompts, (1,), ToyEngine(**PEAKED), settings=ALL_SETTINGS[1:])
    out = tmp_path / "all.json"
    argv = ["bench-real", "--config", TOY_YAML, "--chains", "2", "--repeats", "1", "--mh-steps", "2", "--block-size", "8"]
    assert main([*argv, "--settings", "all", "--n", "2", "--out", str(out), "--png", str(tmp_path / "all.png")]) == 0
    assert [r["setting"] for r in json.loads(out.read_text())["rows"]] == [name for name, *_ in ALL_SETTINGS]
    capsys.readouterr()
