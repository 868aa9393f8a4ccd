"""The check commands' inputs: `validate --reference-config` (another engine's serial chain as the
reference, in law: the same law required, the same prompt tokens required) and eval's config
reader (a malformed YAML file is one line)."""

from __future__ import annotations

import json

import pytest
import yaml

from presto_ray.cli import main
from presto_ray.config import SamplerConfig
from presto_ray.validate_reference import NOT_LAW, law_difference, law_fields, token_difference

# tests/test_validate.py's toy (alpha 1: the acceptance and the lengths move with the model)
TOY_JOB = {
    "engine": {"kind": "toy", "vocab_size": 16, "eos_token_id": 0, "seed": 1, "logit_scale": 1.0, "eos_bias": 1.0},
    "sampler": {"alpha": 1.0, "block_size": 24, "mh_steps": 10, "prefetch_budget": 8, "traversal": "predictive", "seed": 0},
    "chains_per_prompt": 60,
}


def _write(tmp_path, name: str, job: dict):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(job))
    return path


def _prompts(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hello"}\n{"id": "b", "prompt": "sum"}\n')
    return prompts


def _one_line_refusal(capsys, argv, message: str) -> None:
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert err.startswith("presto-ray: error: ") and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err, err


# --- the law: every field that changes it is compared -------------------------------------------
@pytest.mark.parametrize("field,value", [
    ("alpha", 2.0), ("proposal_temperature", 0.5), ("block_size", 12), ("num_blocks", 2), ("mh_steps", 3),
    ("sampler", "entropy_cut"), ("fixed_length", True), ("stop_at_eos", False),
])  # fmt: skip
def test_a_reference_config_with_another_law_is_refused_naming_the_field(field, value):
    tested = SamplerConfig.model_validate(TOY_JOB["sampler"])
    why = law_difference(tested, tested.model_copy(update={field: value}), "c.yaml")
    assert why is not None and why.startswith(f"--reference-config c.yaml: sampler.{field} is {value!r} there"), why


def test_fields_that_change_only_the_speed_are_not_compared():
    tested = SamplerConfig.model_validate(TOY_JOB["sampler"])
    assert NOT_LAW < set(SamplerConfig.model_fields)
    faster = tested.model_copy(update={"traversal": "bfs", "schedule": "rounds", "prefetch_budget": 3, "seed": 9,
                                       "early_rejection": False, "speculation_gain": 0.0, "min_expected_gain": 0.1})  # fmt: skip
    assert law_difference(tested, faster, "c.yaml") is None
    # tau as used: unset is 1/alpha; a sampler's own parameters count only for that sampler
    assert law_difference(tested, tested.model_copy(update={"proposal_temperature": 1.0}), "c.yaml") is None
    assert law_difference(tested, tested.model_copy(update={"num_tries": 8, "entropy_beta": 2.0}), "c.yaml") is None
    multi = tested.model_copy(update={"sampler": "multi_try"})
    assert "sampler.num_tries" in (law_difference(multi, multi.model_copy(update={"num_tries": 8}), "c.yaml") or "")
    assert set(law_fields(tested)) | NOT_LAW | {"num_tries", "entropy_beta"} == set(SamplerConfig.model_fields)


def test_prompts_that_tokenize_differently_are_refused_naming_the_prompt():
    assert token_difference([("a", [1, 2], [1, 2])], (0, 0), "c.yaml") is None
    why = token_difference([("a", [1, 2], [1, 2]), ("b", [3, 4, 5], [3, 7, 5])], (0, 0), "c.yaml")
    assert why is not None and "prompt 'b' tokenizes differently" in why and "first difference at token 1" in why
    assert "EOS tokens differ (0 tested, 2 reference)" in (token_difference([], (0, 2), "c.yaml") or "")


def test_validate_refuses_a_reference_config_in_one_line(tmp_path, capsys):
    tested, prompts, out = _write(tmp_path, "a.yaml", TOY_JOB), _prompts(tmp_path), tmp_path / "v.json"
    other_law = _write(tmp_path, "c.yaml", {**TOY_JOB, "sampler": {**TOY_JOB["sampler"], "mh_steps": 4}})
    _one_line_refusal(capsys, ["validate", "--config", str(tested), "--prompts", str(prompts), "--out", str(out),
                               "--reference-config", str(other_law)], f"{other_law}: sampler.mh_steps is 4 there and 10")  # fmt: skip
    other_tokens = _write(tmp_path, "t.yaml", {**TOY_JOB, "engine": {**TOY_JOB["engine"], "vocab_size": 17}})
    _one_line_refusal(capsys, ["validate", "--config", str(tested), "--prompts", str(prompts), "--out", str(out),
                               "--reference-config", str(other_tokens)], "prompt 'a' tokenizes differently")  # fmt: skip
    _one_line_refusal(capsys, ["validate", "--config", str(tested), "--prompts", str(prompts), "--out", str(out),
                               "--reference-config", str(tmp_path / "missing.yaml")], "missing.yaml")  # fmt: skip
    assert not out.exists()


# --- toy against toy ------------------------------------------------------------------------------
def _validate_against(tmp_path, capsys, reference_engine: dict) -> tuple[dict, str]:
    tested = _write(tmp_path, "a.yaml", TOY_JOB)
    reference = _write(tmp_path, "c.yaml", {**TOY_JOB, "engine": reference_engine, "sampler": {**TOY_JOB["sampler"], "seed": 5}})
    out = tmp_path / "v.json"
    argv = ["validate", "--config", str(tested), "--prompts", str(_prompts(tmp_path)), "--out", str(out),
            "--reference-config", str(reference)]  # fmt: skip
    assert main(argv) == 0
    return json.loads(out.read_text()), capsys.readouterr().out


def test_a_toy_reference_with_the_same_law_is_equivalent(tmp_path, capsys):
    """Engine fields that change no sample (latency, context length) on the reference side: the
    same law, so equivalent; the serial side is the reference engine's (its seeds are the tested
    config's, so the samples are the plain run's serial side's)."""
    same_law = {**TOY_JOB["engine"], "max_model_len": 512, "call_latency_s": 0.0001}
    report, out = _validate_against(tmp_path, capsys, same_law)
    assert report["verdict"] == "equivalent" and report["audit"]["disagreements"] == 0, out
    assert report["reference"]["engine"]["max_model_len"] == 512
    assert f"serial on toy ({tmp_path / 'c.yaml'}) vs predictive/streaming on toy" in out


def test_a_toy_reference_whose_engine_changes_the_law_is_not_equivalent(tmp_path, capsys):
    """A reference engine with a sharper model (logit_scale 1 -> 3): another law, which the law
    tests show; the tested side's kernel is still the config's (the audit agrees)."""
    report, out = _validate_against(tmp_path, capsys, {**TOY_JOB["engine"], "logit_scale": 3.0})
    assert report["verdict"] == "NOT equivalent" and report["audit"]["disagreements"] == 0, out
    assert any(r["difference_shown"] for r in report["rows"]) and "NOT equivalent: " in out


# --- eval's config reader -------------------------------------------------------------------------
def test_eval_refuses_a_malformed_yaml_config_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine:\n  kind: toy\n sampler: [\n")
    message = (f"{bad}: not valid YAML: while parsing a block mapping; expected <block end>, but found "
               "'<block mapping start>' (line 3, column 2)")  # fmt: skip
    for quick in ([], ["--quick"]):
        _one_line_refusal(capsys, ["eval", "--config", str(bad), *quick, "--out", str(tmp_path / "e.json")], message)
    assert not (tmp_path / "e.json").exists()
