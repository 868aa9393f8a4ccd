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
from presto_ray.validate import run_validation
from presto_ray.validate_fault import faulty_kernel
from presto_ray.validate_stats import STATISTICS, Margins, tost

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
    assert report["audit"]["complete"] and report["audit"]["disagreements"] == 0 and "all agree, exactly" in table

    broken = _validate(toy_config, tmp_path, "--fault")  # exit status 0 either way
    assert broken["equivalent"] is False and broken["fault"] is True
    verdicts = {r["statistic"]: r["equivalent"] for r in broken["rows"]}
    assert verdicts["acceptance_rate"] is False and verdicts["length"] is False
    # the serial side is the same chains in both runs: only the prefetching side was broken
    assert broken["samples"]["serial"] == report["samples"]["serial"]
    out = capsys.readouterr().out
    assert broken["audit"]["disagreements"] > 0 and "NOT equivalent: the decision audit" in out


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


def test_the_recording_kernel_changes_no_sample_and_records_every_step():
    """The serial side's kernel records each step's ratio and cut correction: its samples are the
    kernel's, token for token, and it records one step per transition."""
    from presto_ray.engines.toy import ToyEngine
    from presto_ray.validate_fault import DecisionRecorder

    toy = LocalBackend(ToyEngine(16, 0, 1, logit_scale=1.0, eos_bias=1.0))
    config = SamplerConfig(alpha=2.0, block_size=12, num_blocks=2, mh_steps=4, traversal="serial", schedule="rounds", seed=0)
    for sampler in ("power_mh", "entropy_cut", "multi_try"):
        configs = [config.model_copy(update={"seed": s, "sampler": sampler, "num_tries": 2}) for s in range(12)]
        recorder = DecisionRecorder()
        plain, recorded = toy.sample([[3, 4]] * 12, configs), toy.sample([[3, 4]] * 12, configs, kernel_factory=recorder)
        assert [r.token_ids for r in recorded] == [r.token_ids for r in plain], sampler
        for c, r in zip(configs, recorded):
            steps = recorder.by_seed[c.seed]
            assert len(steps) == r.stats.transitions and sum(a for _, _, a in steps) == r.stats.accepted
        assert any(correction != 0.0 for c in configs for _, correction, _ in recorder.by_seed[c.seed]), sampler


def test_fault_weights_are_the_faulty_kernels_decision_probabilities():
    from presto_ray.validate_fault import fault_weights

    # accepted at A = 1 where the fault has A' = e^-0.5; rejected at A = e^-1 where A' = e^-0.3
    weight, flips = fault_weights([(0.2, 0.7, True), (-1.0, -0.7, False)])
    a1, a2, f2 = 1.0, np.exp(-1.0), np.exp(-0.3)
    assert weight == pytest.approx(np.exp(-0.5) / a1 * (1 - f2) / (1 - a2))
    assert flips == pytest.approx((1 - np.exp(-0.5)) + (f2 - a2))
    assert fault_weights([(0.3, 0.0, True), (-2.0, 0.0, False)]) == (1.0, 0.0)  # no correction: the same law


def test_the_faulty_kernel_keeps_exact_early_rejection():
    """validate --fault's kernel stops proposals early like the real one (its cost), and the
    samples are those it draws without early rejection: the bound is its own ratio's."""
    from presto_ray.engines.toy import ToyEngine

    toy = LocalBackend(ToyEngine(16, 0, 1, logit_scale=2.0, eos_bias=0.0))
    config = SamplerConfig(alpha=4.0, block_size=16, mh_steps=6, prefetch_budget=4, traversal="predictive", seed=0)
    configs = [config.model_copy(update={"seed": s}) for s in range(8)]
    with_bound = toy.sample([[3, 4]] * 8, configs, kernel_factory=faulty_kernel)
    without = toy.sample([[3, 4]] * 8, [c.model_copy(update={"early_rejection": False}) for c in configs], kernel_factory=faulty_kernel)
    assert [r.token_ids for r in with_bound] == [r.token_ids for r in without]
    assert sum(r.stats.early_rejected_steps for r in with_bound) > 0 == sum(r.stats.early_rejected_steps for r in without)
    assert faulty_kernel(config.model_copy(update={"sampler": "entropy_cut"})).rejection_bound(
        type("S", (), {"__len__": lambda self: 4})(), 1, 0.5) is None  # fmt: skip


def test_validate_reports_its_power_against_the_fault(toy_config, tmp_path, capsys):
    """At alpha = 1 the fault flips about 3 decisions per chain: predicted power 1 at 120 per side,
    and the --fault run is detected; the prediction of the acceptance rate's shift is exact there
    (the broken kernel accepts every proposal)."""
    report = _validate(toy_config, tmp_path)
    power = report["power"]
    assert power["power"] >= 0.9 and power["flips_per_chain"] > 1 and power["samples_needed"] <= 120
    assert set(power["power_by_statistic"]) == set(STATISTICS)
    out = capsys.readouterr().out
    assert "power vs fault" in out and "power against the fault (length correction dropped): 1.00" in out
    broken = _validate(toy_config, tmp_path, "--fault")
    rows = {r["statistic"]: r for r in broken["rows"]}
    assert rows["acceptance_rate"]["difference"] == pytest.approx(power["shift"]["acceptance_rate"], abs=1e-9)
    assert rows["acceptance_rate"]["difference_shown"] and rows["length"]["difference_shown"]


def test_validate_grows_a_run_to_the_samples_that_give_power_against_the_fault(tmp_path, capsys):
    """Too few samples for 90% power against the fault: the serial side runs more chains, the
    prefetching side the final count; --max-samples below the need keeps the run and says so."""
    job = {**TOY_JOB, "chains_per_prompt": 2}
    config = tmp_path / "few.yaml"
    config.write_text(yaml.safe_dump(job))
    absolute = ["--margin", "mean_logp0=1", "--margin", "length=9", "--margin", "alpha_logp0=40", "--margin",
                "acceptance_rate=0.3", "--margin", "eos=0.5"]  # absolute margins: the TOST asks for no size
    report = _validate(config, tmp_path, *absolute)
    err = capsys.readouterr().err
    n = report["power"]["samples_per_side"]
    assert n == 2 * report["chains_per_prompt"] > 4 and report["power"]["power"] >= 0.9, report["power"]
    assert "more chains: about" in err and all(r["n_serial"] == r["n_prefetch"] == n for r in report["rows"])
    assert [s["chain"] for s in report["samples"]["serial"]] == list(range(n // 2)) * 2  # in prompt order
    capped = _validate(config, tmp_path, "--max-samples", "6", *absolute)
    assert capped["chains_per_prompt"] == 2 and any("--max-samples" in note for note in capped["notes"])
    exactly = _validate(config, tmp_path, "--chains", "2", *absolute)  # --chains: exactly that many
    assert exactly["chains_per_prompt"] == 2 and exactly["power"]["power"] < 0.9


def test_on_the_toy_configs_settings_the_fault_changes_almost_no_decision():
    """configs/toy.yaml (alpha 4, answers at the 96-token horizon): the length correction decides
    nearly no MH step, so the faulty kernel draws the correct one's samples token for token and no
    run of any feasible size can tell them apart; validate's power says so."""
    from pathlib import Path

    from presto_ray.engines import build_engine
    from presto_ray.job import JobConfig
    from presto_ray.validate_fault import DecisionRecorder, fault_power

    job = JobConfig.model_validate(yaml.safe_load((Path(__file__).resolve().parent.parent / "configs/toy.yaml").read_text()))
    toy = LocalBackend(build_engine(job.engine))
    serial = job.sampler.model_copy(update={"traversal": "serial", "schedule": "rounds", "prefetch_budget": 1})
    configs = [serial.model_copy(update={"seed": s}) for s in range(16)]
    prompts = [toy.tokenizer.encode("hello")] * 16
    recorder = DecisionRecorder()
    right = toy.sample(prompts, configs, kernel_factory=recorder)
    wrong = toy.sample(prompts, configs, kernel_factory=faulty_kernel)
    assert [r.token_ids for r in wrong] == [r.token_ids for r in right]
    from presto_ray.validate import sample_statistics

    stats = [sample_statistics(r, 4.0, 0) for r in right]
    power = fault_power(stats, [recorder.by_seed[c.seed] for c in configs], 104, 0.01)
    assert power.flips_per_chain < 1e-2 and power.power_bound < 0.1 + 0.05 and power.power < 0.1
    assert power.samples_needed is None or power.samples_needed > 10_000


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
    assert local.audit is not None and on_ray.audit is not None  # the audit runs where the chains walk: the driver
    assert local.audit["disagreements"] > 0 and on_ray.audit["disagreements"] > 0 and on_ray.audit["complete"]
    assert [c.token_ids for c in generated] == [c.token_ids for c in toy.generate(requests)]


# --- too few samples is not a difference (the probe's item 13) -----------------------------------
def test_a_tost_that_cannot_show_equivalence_says_so_rather_than_not_equivalent(toy_config, tmp_path, capsys):
    from presto_ray.validate_stats import TostResult, row_verdict, samples_needed

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
