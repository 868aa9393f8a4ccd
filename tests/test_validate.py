"""`presto-ray validate`: the TOST itself, the toy check that passes for the sampler and fails for
the broken kernel, a short run on vLLM, and the Ray path."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from scipy import stats

from presto_ray.backend import LocalBackend
from presto_ray.cli import main
from presto_ray.config import SamplerConfig
from presto_ray.engines.base import ProposalRequest
from presto_ray.validate import STATISTICS, Margins, faulty_kernel, run_validation, tost

# A toy where answers end at EOS after ~8 of 24 tokens with a wide spread of lengths, and alpha = 1
# (target p0, proposal p0): the MH ratio is then the length correction alone, so the fault bites
# hard (measured: acceptance +1.5 sd, length +0.8 sd) while 2 x 60 samples per side take seconds.
TOY_JOB = {
    "engine": {"kind": "toy", "vocab_size": 16, "eos_token_id": 0, "seed": 1, "logit_scale": 1.0, "eos_bias": 1.0},
    "sampler": {"alpha": 1.0, "block_size": 24, "mh_steps": 10, "prefetch_budget": 8, "traversal": "predictive", "seed": 0},
    "chains_per_prompt": 60,
}


# --- the test on synthetic data --------------------------------------------------------------
def test_tost_calls_equal_means_equivalent_and_shifted_ones_not():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.0, 1.0, 300), rng.normal(0.0, 1.0, 300)
    assert tost(a, b, margin=0.5).equivalent
    shifted = rng.normal(1.0, 1.0, 300)
    result = tost(a, shifted, margin=0.5)
    assert not result.equivalent and result.ci_low > 0.5
    # too few samples cannot show equivalence even when the means agree
    assert not tost(a[:5], b[:5], margin=0.5).equivalent


def test_tost_agrees_with_two_one_sided_welch_tests():
    """The two p-values are scipy's one-sided Welch tests of the shifted samples."""
    rng = np.random.default_rng(1)
    a, b = rng.normal(0.0, 1.0, 40), rng.normal(0.3, 2.0, 70)
    result = tost(a, b, margin=0.4, alpha=0.05)
    lower = stats.ttest_ind(b + 0.4, a, equal_var=False, alternative="greater").pvalue
    upper = stats.ttest_ind(b - 0.4, a, equal_var=False, alternative="less").pvalue
    assert result.p_lower == pytest.approx(lower, rel=1e-9)
    assert result.p_upper == pytest.approx(upper, rel=1e-9)
    # equivalent exactly when the 90% interval lies inside the margin
    for margin in np.linspace(0.0, 2.0, 41):
        r = tost(a, b, margin=margin)
        assert r.equivalent == (-margin < r.ci_low and r.ci_high < margin)


def test_tost_without_spread_compares_the_exact_difference():
    assert tost([5, 5, 5], [5, 5], margin=0.0).equivalent
    assert tost([5, 5, 5], [6, 6], margin=0.5).equivalent is False
    assert tost([5, 5, 5], [6, 6], margin=1.5).equivalent


def test_margins_parse_standardised_and_absolute():
    m = Margins.parse(["0.3", "length=2"])
    assert m.sd == 0.3 and m.absolute == {"length": 2.0}
    a, b = [0.0, 2.0], [0.0, 2.0]
    assert m.margin("length", a, b) == (2.0, "absolute")
    assert m.margin("mean_logp0", a, b)[0] == pytest.approx(0.3 * np.std(a + b, ddof=1))
    with pytest.raises(ValueError, match="unknown statistic"):
        Margins.parse(["lenght=2"])
    with pytest.raises(ValueError, match="expected a number"):
        Margins.parse(["wide"])


# --- on the toy: the sampler passes, the broken kernel fails ---------------------------------
@pytest.fixture
def toy_config(tmp_path):
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(TOY_JOB))
    return path


def _validate(config, tmp_path, *extra) -> dict:
    out = tmp_path / f"validate{len(extra)}.json"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hello"}\n{"id": "b", "prompt": "sum"}\n')
    assert main(["validate", "--config", str(config), "--prompts", str(prompts), "--out", str(out), *extra]) == 0
    return json.loads(out.read_text())


def test_validate_on_the_toy_passes_for_prefetching_and_fails_without_the_length_correction(toy_config, tmp_path, capsys):
    report = _validate(toy_config, tmp_path)
    assert report["equivalent"] is True
    assert [r["statistic"] for r in report["rows"]] == list(STATISTICS)
    assert all(r["n_serial"] == r["n_prefetch"] == 120 for r in report["rows"])
    table = capsys.readouterr().out
    assert "| acceptance_rate" in table and "equivalent: True" in table

    broken = _validate(toy_config, tmp_path, "--fault")  # exit status 0 either way
    assert broken["equivalent"] is False and broken["fault"] is True
    verdicts = {r["statistic"]: r["equivalent"] for r in broken["rows"]}
    assert verdicts["acceptance_rate"] is False and verdicts["length"] is False
    # the serial side is the same chains in both runs: only the prefetching side was broken
    assert broken["samples"]["serial"] == report["samples"]["serial"]
    assert "NOT equivalent" in capsys.readouterr().out


def test_validate_refuses_a_serial_config_and_bad_margins(toy_config, tmp_path, capsys):
    serial = tmp_path / "serial.yaml"
    serial.write_text(yaml.safe_dump({**TOY_JOB, "sampler": {**TOY_JOB["sampler"], "traversal": "serial"}}))
    assert main(["validate", "--config", str(serial), "--out", str(tmp_path / "x.json")]) == 2
    assert "traversal is 'serial'" in capsys.readouterr().err
    assert main(["validate", "--config", str(toy_config), "--margin", "wide", "--out", str(tmp_path / "x.json")]) == 2
    assert "--margin" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("sampler", ["power_mh", "multi_try"])
def test_the_faulty_kernel_ratio_is_the_kernels_without_the_length_correction(sampler):
    """One MH step whose proposal shortens the state (|x| = 4, |y| = 3): the faulty kernel's log
    ratio is the kernel's less log P(c | y) - log P(c | x) = log|x| - log|y|, everything else (the
    weights, MultiTryMH's selected try) the same, so it rejects where the kernel accepts."""
    from presto_ray.engines.base import Completion
    from presto_ray.keys import StepKeys
    from presto_ray.kernels import build_kernel
    from presto_ray.state import ChainState

    config = SamplerConfig(alpha=2.0, sampler=sampler, num_tries=2)
    state = ChainState((4, 5, 6, 7), np.log([0.5, 0.4, 0.3, 0.2]), np.log([0.6, 0.5, 0.4, 0.3]))
    tries = [Completion((0,), np.log([0.01]), np.log([0.4]), "stop")] * config.num_tries  # an unlikely EOS
    cut, length_correction = 2, np.log(4) - np.log(3)

    def step(kernel, accept_uniform):
        return kernel.transition(state, cut, tries, StepKeys(0.5, accept_uniform, 1, 0.5))

    ratio = step(build_kernel(config), 0.5).log_ratio
    v = float(np.exp(ratio - length_correction / 2))  # between the kernel's ratio and the faulty one's
    assert 0 < v < 1
    right, wrong = step(build_kernel(config), v), step(faulty_kernel(config), v)
    assert wrong.log_ratio == pytest.approx(right.log_ratio - length_correction, abs=1e-12)
    assert right.accepted and right.state.tokens == (4, 5, 0)
    assert not wrong.accepted and wrong.state is state


# --- the real model ----------------------------------------------------------------------
@pytest.mark.vllm
def test_validate_on_vllm_completes_and_writes_its_table(vllm_engine, tmp_path):
    tok = vllm_engine.tokenizer
    prompts = [("capital", tok.encode("What is the capital of France?")), ("count", tok.encode("Count to five."))]
    config = SamplerConfig(alpha=4.0, block_size=8, mh_steps=2, prefetch_budget=4, traversal="predictive", seed=3)
    report = run_validation(LocalBackend(vllm_engine), prompts, config, chains_per_prompt=2)
    serial, prefetch = report.samples["serial"], report.samples["prefetch"]
    assert len(serial) == len(prefetch) == 4
    assert all(0 < s["length"] <= 8 and s["mean_logp0"] < 0 for s in serial + prefetch)
    rows = {r["statistic"]: r for r in report.rows}
    assert list(rows) == list(STATISTICS)
    for name, row in rows.items():  # the table's figures are the samples' means
        assert row["mean_serial"] == pytest.approx(np.mean([s[name] for s in serial]))
        assert row["mean_prefetch"] == pytest.approx(np.mean([s[name] for s in prefetch]))
    # 4 samples a side show no difference (the sampler is exact) and cannot show equivalence either
    assert report.verdict == "equivalence not shown" and not report.equivalent
    out = tmp_path / "validate.json"
    out.write_text(json.dumps(report.to_json()))
    assert json.loads(out.read_text())["verdict"] == "equivalence not shown"
    assert [line.split("|")[1].strip() for line in report.table().splitlines()[2:]] == list(STATISTICS)


# --- on Ray --------------------------------------------------------------------------------
def test_validate_on_ray_draws_the_in_process_samples(ray_address):
    """The Ray path (replicas, coordinator, drive_chain) changes no sample: keyed randomness."""
    from actors.ray_backend import RayBackend
    from presto_ray.engines.toy import ToyEngine
    from presto_ray.job import JobConfig

    job = JobConfig.model_validate({**TOY_JOB, "chains_per_prompt": 4})
    prompts = [("a", [3, 4, 5]), ("b", [7, 8])]
    toy = LocalBackend(ToyEngine(16, 0, 1, logit_scale=1.0, eos_bias=1.0))
    local = run_validation(toy, prompts, job.sampler, chains_per_prompt=4, fault=True)
    requests = [ProposalRequest((3, 4), (), 6, 0.0, 1), ProposalRequest((7,), (), 6, 1.0, 2)]
    backend = RayBackend(job, address=ray_address)
    try:
        on_ray = run_validation(backend, prompts, job.sampler, chains_per_prompt=4, fault=True)
        generated = backend.generate(requests)
    finally:
        backend.close()
    assert on_ray.samples == local.samples
    assert [c.token_ids for c in generated] == [c.token_ids for c in toy.generate(requests)]


# --- too few samples is not a difference (the probe's item 13) -----------------------------------
def test_a_tost_that_cannot_show_equivalence_says_so_rather_than_not_equivalent(toy_config, tmp_path, capsys):
    from presto_ray.validate import TostResult, row_verdict, samples_needed

    report = _validate(toy_config, tmp_path, "--chains", "2")  # 4 per side, the margin needs ~104
    out = capsys.readouterr().out
    assert report["equivalent"] is False and report["verdict"] == "equivalence not shown", out
    assert "equivalence not shown: 4 per side, about 104 needed" in out and "NOT equivalent" not in out, out
    assert samples_needed(Margins()) == 104 and samples_needed(Margins(absolute={"length": 1.0})) is None

    def verdict(low, high):
        p = 0.01 if -1.0 < low and high < 1.0 else 0.5  # the interval inside the margin of 1
        return row_verdict(TostResult(0, 0, 9, 9, (low + high) / 2, low, high, 1.0, 8.0, p, p, 0.05))

    assert (verdict(-0.5, 0.5), verdict(1.2, 2.0), verdict(-3, -1.5), verdict(0.2, 1.4)) == (
        "equivalent", "NOT equivalent", "NOT equivalent", "not shown"
    )  # fmt: skip


def test_the_default_validate_run_is_sized_to_show_equivalence(tmp_path, capsys):
    """`validate --config configs/toy.yaml` on its defaults: as many chains as the margin needs."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    fast = yaml.safe_load((root / "configs/toy.yaml").read_text())
    fast["sampler"].update(mh_steps=3)  # the sizing is under test here, not the toy's law at 25 steps
    config = tmp_path / "toy.yaml"
    config.write_text(yaml.safe_dump(fast))
    out = tmp_path / "v.json"
    assert main(["validate", "--config", str(config), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["chains_per_prompt"] == 26 and all(r["n_serial"] == 104 for r in report["rows"])
    assert "26 chains per prompt: about 104 samples per side" in capsys.readouterr().err
