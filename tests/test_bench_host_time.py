"""presto-ray bench --host-time: it runs, every setting gives the serial samples, and its figures
agree with each other (per token and per event from the same CPU seconds, the engine's share
inside the total)."""

import json

import pytest

from bench.host_time import BASE, SETTINGS, format_report, run_host_time_bench
from presto_ray.cli import main

TINY = BASE.model_copy(update={"block_size": 12, "mh_steps": 4})


def test_every_setting_runs_at_every_chain_count_with_consistent_figures(tmp_path):
    out = tmp_path / "host.json"
    report = run_host_time_bench((1, 3), TINY, out_json=out)
    rows = report["rows"]
    assert [(r["setting"], r["chains"]) for r in rows] == [(s[0], n) for n in (1, 3) for s in SETTINGS]
    for row in rows:
        assert row["same_as_serial"], row["setting"]
        assert row["generated_tokens"] > 0 and row["events"] > 0
        assert 0.0 <= row["engine_s"] <= row["cpu_s"]
        assert row["host_ms_per_token"] == pytest.approx(1000 * row["cpu_s"] / row["generated_tokens"])
        control_s = row["cpu_s"] - row["engine_s"]
        assert row["control_ms_per_token"] == pytest.approx(1000 * control_s / row["generated_tokens"])
        assert row["control_us_per_event"] == pytest.approx(1e6 * control_s / row["events"])
    serial = [r for r in rows if r["setting"] == "serial"]
    assert all(r["control_vs_serial"] == 1.0 for r in serial)
    # the serial chain makes one engine call per event it walks; streaming delivers one event
    # per completion or fork point, so at least one per request it did not abort
    for r in rows:
        if r["setting"] == "serial" and r["chains"] == 1:
            assert r["events"] >= r["transitions"]
        # fork points are streaming's alone: rounds and the serial chain wait for whole calls
        assert 0 <= r["fork_events"] < r["events"] if r["schedule"] == "streaming" else r["fork_events"] == 0
    assert json.loads(out.read_text())["rows"] == json.loads(json.dumps(rows))
    assert "streaming + early rejection" in format_report(report)


def test_the_command_writes_its_report_and_profiles(tmp_path, capsys):
    out = tmp_path / "h.json"
    argv = ["bench", "--host-time", "--chain-counts", "1", "--mh-steps", "3", "--block-size", "8", "--profile", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "control ms/token" in printed and "(profile)" in printed
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == len(SETTINGS)
    for row in rows:
        shares = row["profile_shares"]
        assert set(shares) >= {"planning", "walk", "engine", "books and driver"}
        assert all(share >= 0.0 for share in shares.values())
        assert sum(shares.values()) == pytest.approx(1.0)  # the parts do not overlap
    assert main(["bench", "--host-time", "--chain-counts", "0", "--out", str(out)]) == 2


# --- the toy engine's chunked completions: the floats of one token at a time -------------------
def _reference_completion(engine, request):
    """The toy's completion computed one token at a time (its code before the chunked stats)."""
    import numpy as np

    from presto_ray.early_rejection import RequestStop
    from presto_ray.engines.base import Completion

    def log_softmax(z):
        m = z.max()
        return z - (m + np.log(np.exp(z - m).sum()))

    context = request.context_token_ids
    h = engine._context_hash(context)
    last = context[-1] if context else None
    rng = np.random.default_rng(request.seed)
    tokens, logp0, logq, entropy = [], [], [], []
    finish = "length"
    greedy = request.temperature == 0.0
    inv_tau = 0.0 if greedy else 1.0 / request.temperature
    stop = RequestStop(request.rejection_bounds)
    noise = None
    for position in range(request.max_new_tokens):
        z = engine._logits(h, last)
        zq = z * inv_tau
        if greedy:
            token = int(np.argmax(z))
        else:
            if position % 16 == 0:
                noise = rng.gumbel(size=(min(16, request.max_new_tokens - position), engine.vocab_size))
            token = int(np.argmax(zq + noise[position % 16]))
        lp = log_softmax(z)
        tokens.append(token)
        logp0.append(float(lp[token]))
        entropy.append(float(-(np.exp(lp) * lp).sum()))
        logq.append(0.0 if greedy else float(log_softmax(zq)[token]))
        h, last = engine._push(h, token), token
        if request.stop_at_eos and token == engine.eos_token_id:
            finish = "stop"
            break
        if stop.push(logp0[-1], logq[-1], entropy[-1]) and len(tokens) < request.max_new_tokens:
            finish = "rejected"
            break
    return Completion(tuple(tokens), np.array(logp0), np.array(logq), finish, entropy=np.array(entropy))


def test_the_toy_engine_gives_the_floats_of_one_token_at_a_time():
    import math

    from presto_ray.early_rejection import RejectionBound
    from presto_ray.engines.base import ProposalRequest
    from presto_ray.engines.toy import ToyEngine

    engine = ToyEngine(vocab_size=64, eos_token_id=0, seed=1, logit_scale=4.0, eos_bias=-1.0)
    bounds = [
        (),
        (RejectionBound(alpha=4.0, log_accept_uniform=math.log(0.3), cut=4, current_weight=-2.0, current_cut_log_prob=-3.0),),
        (RejectionBound(alpha=4.0, log_accept_uniform=math.log(0.9), cut=4, current_weight=-30.0, current_cut_log_prob=-3.0),),
    ]
    finishes = set()
    for seed in range(40):
        for max_new in (0, 1, 15, 16, 17, 40):
            for temperature in (0.25, 1.0, 0.0):
                for stop_at_eos in (True, False):
                    for bound in bounds:
                        request = ProposalRequest(
                            prompt_token_ids=(5, 6, seed % 7),
                            prefix_token_ids=tuple(range(1, seed % 5)),
                            max_new_tokens=max_new,
                            temperature=temperature,
                            seed=seed,
                            stop_at_eos=stop_at_eos,
                            rejection_bounds=bound,
                        )
                        got, want = engine._complete(request), _reference_completion(engine, request)
                        assert got == want, (seed, max_new, temperature, stop_at_eos, bound)
                        finishes.add(got.finish_reason)
    assert finishes == {"length", "stop", "rejected"}  # every way a completion ends was compared


def test_the_toy_engine_decodes_a_batch_in_lockstep_with_the_completions_of_one_request_at_a_time():
    import random

    from presto_ray.early_rejection import RejectionBound
    from presto_ray.engines.base import ProposalRequest
    from presto_ray.engines.toy import ToyEngine

    def batch(rng, bounded):
        return [
            ProposalRequest(
                prompt_token_ids=tuple(rng.randrange(1, 64) for _ in range(rng.randrange(0, 4))),
                prefix_token_ids=tuple(rng.randrange(0, 64) for _ in range(rng.randrange(0, 20))),
                max_new_tokens=rng.choice((0, 1, 15, 16, 17, 40)),
                temperature=rng.choice((0.25, 1.0, 0.0)),
                seed=rng.randrange(10**6),
                stop_at_eos=rng.random() < 0.7,
                rejection_bounds=bounded if rng.random() < 0.2 else (),
            )
            for _ in range(rng.randrange(2, 12))
        ]

    bounded = (RejectionBound(alpha=4.0, log_accept_uniform=-0.1, cut=4, current_weight=30.0, current_cut_log_prob=-3.0),)
    rng = random.Random(0)
    finishes, sizes = set(), []
    for _ in range(150):
        requests = batch(rng, bounded)
        together, one_at_a_time = ToyEngine(vocab_size=64, eos_token_id=0, seed=1, logit_scale=4.0, eos_bias=-1.0), ToyEngine(
            vocab_size=64, eos_token_id=0, seed=1, logit_scale=4.0, eos_bias=-1.0
        )
        got = together.generate(requests)  # the unbounded ones in lockstep, the bounded one at a time
        want = [one_at_a_time.generate([request]).completions[0] for request in requests]  # the same prefix cache, in order
        assert got.completions == want
        assert got.accounting.generated_tokens == sum(len(c.token_ids) for c in want)
        finishes |= {c.finish_reason for c in want}
        sizes.append(sum(not r.rejection_bounds for r in requests))
    assert finishes == {"length", "stop", "rejected"} and max(sizes) > 5
