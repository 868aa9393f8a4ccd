"""`presto-ray bench-early-rejection` on the toy: the report it writes, checked against sample() and
against a brute-force m* computed on the library's own Chain (bench/early_rejection.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.early_rejection import serial_config
from presto_ray.chain import Chain
from presto_ray.rounds import ChainRounds
from presto_ray.driver import sample
from presto_ray.engines import ToyEngineConfig, build_engine
from presto_ray.job import encode_prompt, prompt_seed
from presto_ray.keys import step_keys
from presto_ray.prompts import read_prompts

TOY = {"kind": "toy", "vocab_size": 48, "eos_token_id": 0, "seed": 1, "logit_scale": 4.0, "eos_bias": -3.0}
SAMPLER = {"alpha": 4.0, "block_size": 24, "num_blocks": 1, "mh_steps": 8, "seed": 0}
PROMPTS = ['{"id": "a", "prompt": "What is the capital of France?"}', '{"id": "b", "prompt": "Reverse a list."}']


def _run(tmp_path, fixed_length: bool) -> tuple[dict, list, object]:
    import yaml

    from presto_ray.cli import main

    config = tmp_path / "toy.yaml"
    config.write_text(yaml.safe_dump({"engine": TOY, "sampler": SAMPLER}))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    out = tmp_path / "new" / "folder" / "report.json"  # the parent does not exist yet
    argv = ["bench-early-rejection", "--config", str(config), "--prompts", str(prompts), "--out", str(out)]
    assert main(argv + (["--fixed-length"] if fixed_length else [])) == 0
    return json.loads(out.read_text()), read_prompts(prompts), ToyEngineConfig(**TOY)


def _row(report: dict, sampler: str, prompt: str) -> dict:
    (row,) = [r for r in report["rows"] if r["sampler"] == sampler and r["prompt"] == prompt]
    return row


def _brute_force(engine, prompt_ids, config) -> list[tuple[int, int, bool, int | None]]:
    """(step, length, accepted, m*) per MH step, on the library's Chain driven round by round; m* by
    scanning m = 0 .. length with rejects_prefix on the proposal's first m tokens."""
    chain = Chain(prompt_ids, config, engine.eos_token_id, record_edges=True)
    rounds = ChainRounds(chain)
    records = []
    while not chain.done:
        event = chain.event
        state, planned = chain.state, rounds.plan()
        requests = planned.requests
        completions = engine.generate(requests).completions
        if not event.is_extension:
            keys = step_keys(config.seed, event.step)
            cut = chain.kernel.cut_law.draw(keys.cut_uniform, state)
            length_known = cut + requests[0].max_new_tokens if config.fixed_length else None
            bound = chain.kernel.rejection_bound(state, cut, keys.accept_uniform, length_known)
        rounds.advance(planned, completions)
        if event.is_extension:
            continue
        edge = chain.edges[-1]
        assert (edge.step, edge.cut) == (event.step, cut)
        proposal = completions[0]
        m_star = None
        if bound is not None:
            for m in range(len(proposal.token_ids) + 1):
                entropy = None if proposal.entropy is None else proposal.entropy[:m]
                if bound.rejects_prefix(proposal.logp0[:m], proposal.logq[:m], entropy):
                    m_star = m
                    break
        records.append((event.step, sum(len(c.token_ids) for c in completions), edge.accepted, m_star))
    assert chain.output_token_ids == sample(engine, prompt_ids, config).token_ids
    return records


@pytest.mark.parametrize("fixed_length", [False, True])
def test_the_bench_reports_the_tokens_the_bound_never_needed(tmp_path, fixed_length):
    report, items, engine_config = _run(tmp_path, fixed_length)
    assert report["clock"]["kind"] == "token counts"
    assert report["config"]["sampler"]["fixed_length"] is fixed_length
    engine = build_engine(engine_config)
    for sampler in ("power_mh", "entropy_cut", "multi_try"):
        for item in items:
            prompt_ids = encode_prompt(engine.tokenizer, item)
            config = serial_config(report_base(report), sampler, prompt_seed(SAMPLER["seed"], item.id, 0))
            # the replay's samples are sample()'s (an independent run on a fresh engine)
            assert report["samples"][sampler][item.id] == list(sample(engine, prompt_ids, config).token_ids)
            row = _row(report, sampler, item.id)
            assert row["same_as_sample"] and row["accepted_but_bound_rejects"] == 0
            steps = report["steps"][sampler][item.id]
            assert row["proposals"] == len(steps) == SAMPLER["mh_steps"]
            if sampler == "multi_try":
                continue
            expected = _brute_force(engine, prompt_ids, config)
            assert [(s["step"], s["length"], s["accepted"], s["m_star"]) for s in steps] == expected
            never = sum(length - m for _, length, accepted, m in expected if not accepted and m is not None)
            assert row["tokens_never_needed"] == never
            assert row["rejected"] == sum(not accepted for _, _, accepted, _ in expected)
    for sampler in ("power_mh", "entropy_cut"):
        total = _row(report, sampler, "all")
        assert total["bound"] and total["caught_early"] > 0 and total["tokens_never_needed"] > 0
        assert total["tokens_never_needed"] == sum(_row(report, sampler, i.id)["tokens_never_needed"] for i in items)
        for key in ("caught_early_share", "never_needed_share", "decode_steps_skipped_share"):
            assert 0.0 <= total[key] <= 1.0, (sampler, key, total[key])
        assert total["decode_steps_skipped_share"] == pytest.approx(total["tokens_never_needed"] / total["generated_tokens"])
    multi = _row(report, "multi_try", "all")
    assert multi["bound"] is False and multi["rejected"] > 0
    assert multi["tokens_never_needed"] is None and multi["never_needed_share"] is None
    assert all(s["m_star"] is None and not s["bound"] for s in report["steps"]["multi_try"]["a"])


def report_base(report: dict):
    from presto_ray.config import SamplerConfig

    return SamplerConfig(**report["config"]["sampler"])


def test_the_command_refuses_an_unknown_sampler(tmp_path, capsys):
    from presto_ray.cli import main

    assert main(["bench-early-rejection", "--config", "configs/toy.yaml", "--samplers", "greedy", "--out", str(tmp_path / "r.json")]) == 2
    assert "--samplers" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_m_star_is_the_first_prefix_that_rejects():
    """first_rejecting_prefix against rejects_prefix on every prefix of a few toy steps."""
    from bench.early_rejection import first_rejecting_prefix
    from presto_ray.config import SamplerConfig
    from presto_ray.engines.base import ProposalRequest
    from presto_ray.kernels import build_kernel
    from presto_ray.state import ChainState

    engine = build_engine(ToyEngineConfig(**TOY))
    config = SamplerConfig(alpha=4.0)
    kernel, horizon, checked = build_kernel(config), 24, 0
    first = ProposalRequest((1, 2), (), horizon, config.tau, 3)
    state = ChainState().replace_suffix(0, engine.generate([first]).completions[0])
    for step in range(10):
        keys = step_keys(7, step)
        cut = kernel.cut_law.draw(keys.cut_uniform, state)
        request = ProposalRequest((1, 2), state.tokens[:cut], horizon - cut, config.tau, keys.proposal_seed)
        proposal = engine.generate([request]).completions[0]
        bound = kernel.rejection_bound(state, cut, keys.accept_uniform)
        assert bound is not None
        scan = [m for m in range(len(proposal.token_ids) + 1) if bound.rejects_prefix(proposal.logp0[:m], proposal.logq[:m])]
        assert first_rejecting_prefix(bound, proposal) == (scan[0] if scan else None)
        # once certain, rejection stays certain: every longer prefix rejects too
        assert scan == list(range(scan[0], len(proposal.token_ids) + 1)) if scan else True
        checked += bool(scan)
        state = kernel.transition(state, cut, [proposal], keys).state
    assert checked > 0
    assert np.isfinite(state.logp0).all()
