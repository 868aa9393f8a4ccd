"""Power sampling on the real engine: vLLM on the CPU with SmolLM2-135M."""

import time

import pytest

from presto_ray import SamplerConfig, sample
from presto_ray.driver import sample_many

pytestmark = pytest.mark.vllm


def test_prefetching_reproduces_the_serial_chain_on_a_real_model(vllm_engine):
    prompt = vllm_engine.tokenizer.encode("Give me one tip for learning to cook.")
    for seed in (0,):  # one seed: the toy's identity tests draw hundreds
        results = {
            t: sample(vllm_engine, prompt, SamplerConfig(block_size=24, mh_steps=8, prefetch_budget=8, traversal=t, seed=seed, schedule="rounds"))
            for t in ("serial", "bfs", "predictive")
        }
        serial = results["serial"]
        assert serial.stats.rounds == serial.stats.transitions + serial.stats.extensions == 9
        for name in ("bfs", "predictive"):
            assert results[name].token_ids == serial.token_ids, (seed, name)
            assert results[name].stats.accepted == serial.stats.accepted
            assert results[name].stats.rounds < serial.stats.rounds
        assert vllm_engine.tokenizer.decode(serial.token_ids).strip()


def test_chains_share_calls_without_changing_samples(vllm_engine):
    tok = vllm_engine.tokenizer
    prompts = [tok.encode("Name a color."), tok.encode("Name an animal.")]
    configs = [SamplerConfig(block_size=16, mh_steps=4, prefetch_budget=4, seed=s, schedule="rounds") for s in (3, 4)]
    together, accounting = sample_many(vllm_engine, prompts, configs)
    alone = [sample(vllm_engine, p, c) for p, c in zip(prompts, configs)]
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert accounting.calls < sum(r.stats.rounds for r in alone)
    assert accounting.cached_prompt_tokens > 0


@pytest.mark.parametrize(
    "variant", [dict(sampler="multi_try", num_tries=3), dict(sampler="entropy_cut")], ids=["multi_try", "entropy_cut"]
)
def test_variants_reproduce_their_serial_chain_on_a_real_model(vllm_engine, variant):
    prompt = vllm_engine.tokenizer.encode("Name a planet.")
    base = SamplerConfig(block_size=12, mh_steps=5, prefetch_budget=9, seed=2, schedule="rounds", **variant)
    serial = sample(vllm_engine, prompt, base.model_copy(update={"traversal": "serial"}))
    for traversal in ("predictive",):  # bfs is checked above (PowerMH) and on the toy for every sampler
        prefetched = sample(vllm_engine, prompt, base.model_copy(update={"traversal": traversal}))
        assert prefetched.token_ids == serial.token_ids, traversal
        assert prefetched.stats.accepted == serial.stats.accepted
        assert prefetched.stats.rounds < serial.stats.rounds
    assert serial.stats.requests == 1 + 5 * variant.get("num_tries", 1)


class CountingStream:
    """A streaming engine that records each abort the driver sends and whether the request was
    still live in the engine then (an abort of a request whose completion is already queued is not
    one the engine sees)."""

    def __init__(self, stream):
        self.stream, self.abort_calls, self.live_aborts = stream, 0, 0

    def __getattr__(self, name):
        return getattr(self.stream, name)

    @property
    def busy(self):
        return self.stream.busy

    def abort(self, handle):
        self.abort_calls += 1
        self.live_aborts += handle in self.stream._live
        self.stream.abort(handle)


def test_streaming_reproduces_the_serial_chain_on_a_real_model(vllm_engine):
    """Per-request vLLM streams (DELTA outputs, fork wake-ups, abort, priority): the serial samples,
    forks and aborts happen and are counted, and nothing is left running in vLLM once the chains
    are done."""
    from presto_ray.chain import Chain
    from presto_ray.streaming import run_streaming

    tok = vllm_engine.tokenizer
    prompts = [tok.encode("Name three prime numbers."), tok.encode("Give me one tip for learning to cook.")]
    chain_aborts = engine_aborts = 0
    for fixed_length in (True, False):
        base = SamplerConfig(block_size=24, mh_steps=8, prefetch_budget=8, seed=3, fixed_length=fixed_length)
        serial = [sample(vllm_engine, p, base.model_copy(update={"traversal": "serial"})) for p in prompts]
        chains = [Chain(p, base.model_copy(update={"schedule": "streaming"}), vllm_engine.eos_token_id) for p in prompts]
        stream = CountingStream(vllm_engine.streaming())
        run_streaming(stream, chains)
        assert [c.output_token_ids for c in chains] == [s.token_ids for s in serial], fixed_length
        assert [c.stats.accepted for c in chains] == [s.stats.accepted for s in serial]
        assert not stream.busy
        assert sum(c.stats.forked_requests for c in chains) > 0  # forks happened on the real model
        # every request a chain dropped was aborted once, and the engine counted those still live
        assert stream.abort_calls == sum(c.stats.aborted_requests for c in chains)
        assert stream.clock.aborted_requests == stream.live_aborts
        chain_aborts += stream.abort_calls
        engine_aborts += stream.clock.aborted_requests
    assert chain_aborts > 0 and engine_aborts > 0  # this config aborts running requests in vLLM
    deadline = time.monotonic() + 30  # aborts reach vLLM's scheduler asynchronously
    while vllm_engine.runtime.llm.get_num_unfinished_requests() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert vllm_engine.runtime.llm.get_num_unfinished_requests() == 0


def test_a_request_at_the_context_limit_is_served_and_one_token_more_is_refused(vllm_engine):
    """With log p0 from the sampler there is no scoring pass: the usable context is max_model_len.
    At that limit vLLM serves the request; one token more is refused by validate (a 400 over
    HTTP, checked against the same context_length), not by vLLM (a 500)."""
    from presto_ray.engines.base import ProposalRequest

    limit = vllm_engine.context_length
    assert limit == vllm_engine.max_model_len
    max_new = 4
    filler = vllm_engine.tokenizer.encode_raw(" the cat sat on the mat" * 400)[: limit - max_new]
    at_limit = ProposalRequest(tuple(filler), (), max_new, 1.0, seed=1, stop_at_eos=False)
    (completion,) = vllm_engine.generate([at_limit]).completions
    assert len(completion.token_ids) == max_new and len(completion.logp0) == max_new
    over = ProposalRequest(tuple(filler) + (filler[0],), (), max_new, 1.0, seed=1, stop_at_eos=False)
    with pytest.raises(ValueError, match="exceeds the context of"):
        vllm_engine.validate(over)


def test_log_p0_from_the_sampler_is_the_scoring_pass_s_without_a_second_pass(vllm_engine):
    """The wrapped sampler's log p0 of each sampled token equals what a scoring pass computes for
    the same tokens (float32 round-off), and no scoring pass ran."""
    import numpy as np

    from presto_ray.engines.base import ProposalRequest

    prompt = tuple(vllm_engine.tokenizer.encode("Name three rivers."))
    requests = [ProposalRequest(prompt, prompt[-s:], 16, t, seed=s, stop_at_eos=False) for s in (1, 2) for t in (0.25, 1.0)]
    out = vllm_engine.generate(requests)
    assert out.accounting.scoring_tokens == 0
    for request, completion in zip(requests, out.completions):
        score = vllm_engine.score(request, completion.token_ids)
        offset = len(request.context_token_ids)
        scored = [score.prompt_logprobs[offset + i][t].logprob for i, t in enumerate(completion.token_ids)]
        np.testing.assert_allclose(completion.logp0, scored, atol=1e-4)
        if request.temperature != 1.0:  # two columns, not one read twice
            assert not np.allclose(completion.logp0, completion.logq)


def test_an_unwrapped_sampler_is_a_clear_error():
    """When vLLM's sampler was not wrapped (another vLLM), the columns are missing: the error names
    the way out instead of handing the chain log q_tau as log p0."""
    from vllm.logprobs import FlatLogprobs

    from presto_ray.engines.vllm.sampler_columns import sampler_columns

    one_column = FlatLogprobs(start_indices=[0, 1], end_indices=[1, 2], token_ids=[5, 6], logprobs=[-1.0, -2.0], ranks=[1, 1], decoded_tokens=[None, None])
    with pytest.raises(RuntimeError, match="logp0_from to 'scoring_pass'"):
        sampler_columns(one_column, [5, 6])
    three = FlatLogprobs(start_indices=[0], end_indices=[3], token_ids=[5, 5, 5], logprobs=[-1.0, -0.5, 2.0], ranks=[1, 1, 2], decoded_tokens=[None] * 3)
    assert sampler_columns(three, [5]).tolist() == [[-1.0, -0.5, 2.0]]
