"""Exact early rejection on the real engine (vLLM on the CPU, SmolLM2-135M): the engine stops a
request once every bound it carries rejects (presto_ray/engines/vllm/codec.py's TokenReader, in
the batch path and the streaming form alike), and the chains' samples do not change."""

import time

import numpy as np
import pytest

from presto_ray import SamplerConfig, sample
from presto_ray.chain import Chain
from presto_ray.early_rejection import RejectionBound
from presto_ray.engines.base import ProposalRequest
from presto_ray.streaming import run_streaming

pytestmark = pytest.mark.vllm

# (prompt, sampler settings), measured to stop requests early in every schedule (2026-12-01):
# PowerMH 3 serial / 5 rounds / 3 streaming stops, EntropyCut 3 / 3 / 3 (a short answer: cheap)
SAMPLERS = {
    "power_mh": ("Write a haiku about rain.", dict(block_size=24, mh_steps=6)),
    "entropy_cut": ("What is the capital of France?", dict(block_size=24, mh_steps=6)),
}


def _wait_until_vllm_is_idle(engine, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s  # aborts reach vLLM's scheduler asynchronously
    while engine.runtime.llm.get_num_unfinished_requests() and time.monotonic() < deadline:
        time.sleep(0.05)
    return engine.runtime.llm.get_num_unfinished_requests()


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_early_rejection_changes_no_sample_and_stops_requests_on_a_real_model(vllm_engine, sampler):
    """alpha 4, tau 1/alpha: with early rejection on, the serial chain (rounds of one request),
    predictive rounds and streaming all give the serial chain's tokens without it, and requests
    stop early, so the serial chain generates fewer tokens.

    log p0 is compared exactly for the serial chain (one request per call either way, so vLLM
    computes the same floats); rounds and streaming batch requests together, and vLLM's CPU
    kernels are not batch-invariant (1e-5 apart, with or without early rejection)."""
    text, settings = SAMPLERS[sampler]
    prompt = vllm_engine.tokenizer.encode(text)
    base = SamplerConfig(**settings, prefetch_budget=8, seed=3, sampler=sampler, alpha=4.0)
    assert base.tau == 0.25
    serial = base.model_copy(update={"schedule": "rounds", "traversal": "serial"})
    off = sample(vllm_engine, prompt, serial.model_copy(update={"early_rejection": False}))
    on = sample(vllm_engine, prompt, serial)
    assert on.token_ids == off.token_ids and on.logp0 == off.logp0
    assert on.stats.accepted == off.stats.accepted and on.stats.transitions == off.stats.transitions
    assert off.stats.early_stopped_requests == 0
    assert on.stats.early_stopped_requests > 0 and on.stats.early_rejected_steps > 0  # it fires
    assert on.stats.early_stop_rerequests == 0  # the serial chain's stops are all usable
    assert on.stats.generated_tokens < off.stats.generated_tokens

    rounds = sample(vllm_engine, prompt, base.model_copy(update={"schedule": "rounds", "traversal": "predictive"}))
    assert rounds.token_ids == off.token_ids and rounds.stats.accepted == off.stats.accepted
    np.testing.assert_allclose(rounds.logp0, off.logp0, atol=1e-4)
    assert rounds.stats.early_stopped_requests > 0

    stream = vllm_engine.streaming()
    chain = Chain(prompt, base.model_copy(update={"schedule": "streaming"}), vllm_engine.eos_token_id)
    run_streaming(stream, [chain])
    streamed = chain.result()
    assert streamed.token_ids == off.token_ids and streamed.stats.accepted == off.stats.accepted
    np.testing.assert_allclose(streamed.logp0, off.logp0, atol=1e-4)
    # the engine's count: requests it stopped (some may have been aborted by the chain first)
    assert stream.clock.early_stopped_requests >= chain.stats.early_stopped_requests > 0
    assert not stream.busy and _wait_until_vllm_is_idle(vllm_engine) == 0


def _bound_stopping_at(completion, stop_at: int) -> RejectionBound:
    """A PowerMH bound (cut 0, empty current suffix: U_m = S_m - log m) whose log V lies midway
    between U_{stop_at - 1} and U_{stop_at} of `completion`'s tokens: every engine that pushes the
    tokens' own values must stop after exactly `stop_at` tokens."""
    probe = RejectionBound(alpha=4.0, log_accept_uniform=0.0, cut=0, current_weight=0.0, current_cut_log_prob=0.0)
    before = probe.prefix_log_ratio_bound(completion.logp0[: stop_at - 1], completion.logq[: stop_at - 1])
    at = probe.prefix_log_ratio_bound(completion.logp0[:stop_at], completion.logq[:stop_at])
    assert at < before - 1e-3  # -log m alone falls by log(m / (m - 1))
    return RejectionBound(
        alpha=4.0, log_accept_uniform=(before + at) / 2, cut=0, current_weight=0.0, current_cut_log_prob=0.0
    )


def test_a_stopped_request_is_a_prefix_of_the_full_one_in_both_forms(vllm_engine):
    """The same request (same seed) with and without a bound: with it, the batch call and the
    streaming form stop after exactly the token where the bound first rejects, with that prefix's
    tokens and log p0, finish reason "rejected", and vLLM decodes less; a request without bounds
    in the same batch call runs to its end (FINAL output). A running request given the bound
    later stops at once, with the tokens it has."""
    prompt = tuple(vllm_engine.tokenizer.encode("Name three rivers."))
    n = 32
    full_request = ProposalRequest(prompt, (), n, 0.25, seed=7, stop_at_eos=False)
    other = ProposalRequest(prompt, (), n, 0.25, seed=8, stop_at_eos=False)
    full, other_full = vllm_engine.generate([full_request, other]).completions
    assert len(full.token_ids) == n and full.finish_reason == "length"
    stop_at = 10
    bounded = ProposalRequest(prompt, (), n, 0.25, seed=7, stop_at_eos=False, rejection_bounds=(_bound_stopping_at(full, stop_at),))

    out = vllm_engine.generate([bounded, other])
    stopped, unbounded = out.completions
    assert stopped.finish_reason == "rejected" and stopped.stopped_early
    assert stopped.token_ids == full.token_ids[:stop_at]
    np.testing.assert_allclose(stopped.logp0, full.logp0[:stop_at], atol=1e-4)
    # the chain's own check agrees with where the engine stopped (the pushed values are the Completion's)
    assert bounded.rejection_bounds[0].rejects_prefix(stopped.logp0, stopped.logq)
    assert not bounded.rejection_bounds[0].rejects_prefix(stopped.logp0[:-1], stopped.logq[:-1])
    assert unbounded.token_ids == other_full.token_ids and unbounded.finish_reason == "length"
    assert stop_at + n <= out.accounting.generated_tokens < 2 * n  # vLLM decoded less than two full requests

    stream = vllm_engine.streaming()
    handle = stream.submit(bounded)
    events = []
    while not any(e.ended for e in events):
        events += stream.advance()
    (event,) = [e for e in events if e.ended]
    assert event.handle == handle and event.completion.finish_reason == "rejected"
    assert event.completion.token_ids == full.token_ids[:stop_at]
    np.testing.assert_allclose(event.completion.logp0, full.logp0[:stop_at], atol=1e-4)
    assert stream.clock.early_stopped_requests == 1 and stream.clock.aborted_requests == 0
    assert stop_at <= stream.accounting().generated_tokens < n  # the vLLM request was aborted
    assert not stream.busy

    # bounds set on a running request (set_rejection_bounds): it stops at once with the tokens it has
    stream = vllm_engine.streaming()
    handle = stream.submit(full_request)
    stream.wake_at(handle, stop_at)
    (woken,) = stream.advance()
    assert not woken.ended and woken.generated >= stop_at
    stream.set_rejection_bounds(handle, bounded.rejection_bounds)
    (event,) = stream.advance()
    shown = len(event.completion.token_ids)
    assert event.completion.finish_reason == "rejected" and stop_at <= shown < n
    assert event.completion.token_ids == full.token_ids[:shown]
    assert stream.clock.early_stopped_requests == 1 and stream.accounting().generated_tokens < n
    assert not stream.busy and _wait_until_vllm_is_idle(vllm_engine) == 0
