"""validate's decision audit (presto_ray/validate_audit.py): every step the prefetching side's
kernel decides, decided again by the config's kernel on the same inputs. It agrees, exactly, with a
correct kernel in every schedule; it finds the dropped length correction through the full
transitions (early rejection off) and through the bounds (on), and a kernel whose only fault is
its bound through the bounds alone."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from presto_ray.backend import LocalBackend
from presto_ray.config import SamplerConfig
from presto_ray.engines.toy import ToyEngine
from presto_ray.kernels import PowerMHKernel, build_kernel
from presto_ray.validate_audit import DecisionAudit, audit_line
from presto_ray.validate_fault import faulty_kernel

# alpha 4 with EOS after ~10 tokens of 16: many steps change the length and early rejection stops
# about a quarter of them (measured: 13 of 48 steps in 8 chains)
TOY = ToyEngine(16, 0, 1, logit_scale=2.0, eos_bias=0.0)
CONFIG = SamplerConfig(alpha=4.0, block_size=16, mh_steps=6, prefetch_budget=4, traversal="predictive", seed=0)
CHAINS = 8


def _audited(config: SamplerConfig, inner=None) -> tuple[dict, list]:
    configs = [config.model_copy(update={"seed": s}) for s in range(CHAINS)]
    audit = DecisionAudit()
    results = LocalBackend(TOY).sample([[3, 4]] * CHAINS, configs, kernel_factory=audit.factory(inner))
    report = audit.to_json(sum(r.stats.transitions for r in results), sum(r.stats.early_rejected_steps for r in results))
    return report, results


@pytest.mark.parametrize("sampler", ["power_mh", "entropy_cut", "multi_try"])
@pytest.mark.parametrize("early_rejection", [True, False])
@pytest.mark.parametrize("traversal,schedule", [("serial", "rounds"), ("bfs", "rounds"), ("predictive", "rounds"),
                                                ("bfs", "streaming"), ("predictive", "streaming")])  # fmt: skip
def test_the_audit_agrees_exactly_with_a_correct_kernel_in_every_schedule(sampler, early_rejection, traversal, schedule):
    """Every step audited (full transitions + early-rejected steps = steps decided), none differs,
    and the audited kernel draws the plain kernel's samples token for token."""
    config = CONFIG.model_copy(update={"sampler": sampler, "num_tries": 2, "early_rejection": early_rejection,
                                       "traversal": traversal, "schedule": schedule})  # fmt: skip
    report, audited = _audited(config)
    plain = LocalBackend(TOY).sample([[3, 4]] * CHAINS, [config.model_copy(update={"seed": s}) for s in range(CHAINS)])
    assert [r.token_ids for r in audited] == [r.token_ids for r in plain]
    assert report["complete"] and report["disagreements"] == 0, report
    assert report["full_transitions"] + report["early_rejected_steps"] == report["steps"] > 0
    if early_rejection and sampler != "multi_try" and traversal != "serial":  # MultiTryMH carries no bound
        assert report["early_rejected_steps"] > 0 and report["bounds"] >= report["early_rejected_steps"]
    assert audit_line(report).endswith("all agree, exactly")


def _length_corrections(horizon: int) -> set[float]:
    return {abs(math.log(a) - math.log(b)) for a in range(1, horizon + 1) for b in range(1, horizon + 1) if a != b}


def test_the_audit_finds_the_fault_in_the_full_transitions():
    """Early rejection off: every step is a full transition; the faulty kernel's log ratio differs
    from the reference's by exactly the length correction |log|x| - log|y|| where it differs."""
    report, _ = _audited(CONFIG.model_copy(update={"early_rejection": False}), faulty_kernel)
    assert report["complete"] and report["bounds"] == 0 and report["early_rejected_steps"] == 0
    assert report["disagreements_by_kind"] == {"transition": report["disagreements"]} and report["disagreements"] > 0
    corrections = _length_corrections(CONFIG.horizon)
    for d in report["first_disagreements"]:
        assert any(d["difference"] == pytest.approx(c, abs=1e-12) for c in corrections), d
    assert report["largest_log_ratio_difference"] > 0 and "DISAGREE" in audit_line(report)


def test_the_audit_finds_the_fault_in_the_bounds():
    """Early rejection on: the faulty kernel's bounds assume |y| = |x| (its ratio has no cut terms),
    the reference's bound the EOS-aware |y| >= cut + m: every bound it gives differs there."""
    report, _ = _audited(CONFIG, faulty_kernel)
    assert report["complete"] and report["early_rejected_steps"] > 0
    assert report["disagreements_by_kind"]["bound"] == report["bounds"] > 0
    assert report["bound_fields_differing"] == ["candidate_length"]


class _TooEagerBound(PowerMHKernel):
    """A kernel whose ratio is the reference's but whose bound rejects too soon (V_j taken 2x
    larger): steps it stops early never reach a full transition, so only the bounds can show it."""

    def rejection_bound(self, state, cut, accept_uniform, candidate_length=None):
        bound = super().rejection_bound(state, cut, accept_uniform, candidate_length)
        return None if bound is None else replace(bound, log_accept_uniform=bound.log_accept_uniform + math.log(2.0))


def test_a_kernel_whose_only_fault_is_its_bound_is_found_by_the_bounds_alone():
    def eager(config):
        reference = build_kernel(config)
        return _TooEagerBound(reference.alpha, reference.cut_law, reference.tau)

    report, _ = _audited(CONFIG, eager)
    assert report["complete"] and report["early_rejected_steps"] > 0
    assert report["disagreements_by_kind"] == {"bound": report["bounds"]}  # every full transition agrees
    assert report["bound_fields_differing"] == ["log_accept_uniform"]
    assert report["largest_bound_difference"] == pytest.approx(math.log(2.0))


@pytest.mark.slow
def test_on_configs_toy_yaml_at_its_defaults_both_verdicts_come_out_right(tmp_path, capsys):
    """`validate --config configs/toy.yaml` as shipped (104 chains per side, sized by validate):
    equivalent; with --fault NOT equivalent, by the audit, although no law test can see this fault
    there (it flips ~1e-5 decisions per chain: every row stays equivalent). The audit's verdict does
    not depend on the run's size (it re-decides every step), so the --fault run here is 2 chains
    per prompt, to keep the suite's time (both at the defaults: 252 s in the suite, 2026-12-02;
    docs/validate.md has the full-size --fault run: NOT equivalent)."""
    import json
    from pathlib import Path

    from presto_ray.cli import main

    toy = str(Path(__file__).resolve().parent.parent / "configs/toy.yaml")
    for fault in ([], ["--fault", "--chains", "2"]):
        out = tmp_path / f"v{len(fault)}.json"
        assert main(["validate", "--config", toy, "--out", str(out), *fault]) == 0
        report = json.loads(out.read_text())
        assert report["audit"]["complete"] and report["audit"]["steps"] > 0
        if fault:
            assert report["verdict"] == "NOT equivalent" and report["audit"]["disagreements"] > 0
            assert "NOT equivalent: the decision audit" in capsys.readouterr().out
        else:
            assert report["verdict"] == "equivalent" and report["audit"]["disagreements"] == 0


def test_in_fixed_length_mode_the_faulty_kernel_is_the_correct_one_and_the_audit_agrees():
    """Every state has the horizon's length: the length correction is 0 and the faulty bound's
    candidate length |x| is the horizon the chain passes; the audit must not cry wolf."""
    report, _ = _audited(CONFIG.model_copy(update={"fixed_length": True}), faulty_kernel)
    assert report["complete"] and report["early_rejected_steps"] > 0 and report["disagreements"] == 0, report
