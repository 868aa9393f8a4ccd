"""The engine contract, run on every engine (the vLLM engine joins this suite later)."""

import numpy as np
import pytest

from presto_ray.engines.base import ProposalRequest
from presto_ray.engines.toy import ToyEngine

ENGINES = {
    "toy": lambda: ToyEngine(vocab_size=24, eos_token_id=0, seed=4, logit_scale=2.0, eos_bias=-1.0),
}


@pytest.fixture(params=list(ENGINES))
def engine(request):
    return ENGINES[request.param]()


def _request(prefix=(3, 4), seed=11, max_new_tokens=12, temperature=0.5, prompt=(1, 2, 5), stop_at_eos=True):
    return ProposalRequest(tuple(prompt), tuple(prefix), max_new_tokens, temperature, seed, stop_at_eos)


def _reference_logprobs(engine, context, tokens, temperature):
    """Per-token log p0 and log q_tau from the model's next-token distribution."""
    logp0, logq = [], []
    for i, token in enumerate(tokens):
        lp = engine.next_token_logprobs(list(context) + list(tokens[:i]))
        z = lp / temperature
        logp0.append(lp[token])
        logq.append(z[token] - np.logaddexp.reduce(z))
    return np.array(logp0), np.array(logq)


def test_logprobs_are_exact(engine):
    requests = [_request(seed=s, temperature=t) for s in range(4) for t in (0.25, 1.0)]
    for request, completion in zip(requests, engine.generate(requests).completions):
        logp0, logq = _reference_logprobs(engine, request.context_token_ids, completion.token_ids, request.temperature)
        np.testing.assert_allclose(completion.logp0, logp0, atol=1e-9)
        np.testing.assert_allclose(completion.logq, logq, atol=1e-9)


def test_same_key_same_tokens_whatever_the_batch(engine):
    alone = engine.generate([_request(seed=5)]).completions[0]
    batch = engine.generate([_request(seed=9), _request(seed=5), _request(prefix=(7,), seed=5)]).completions
    assert batch[1].token_ids == alone.token_ids
    others = {c.token_ids for c in engine.generate([_request(seed=s) for s in range(8)]).completions}
    assert len(others) > 1  # the seed matters


def test_eos_and_max_tokens(engine):
    eos = engine.eos_token_id
    outputs = engine.generate([_request(seed=s, max_new_tokens=30, temperature=1.5) for s in range(30)]).completions
    for c in outputs:
        assert 1 <= len(c.token_ids) <= 30
        if c.finish_reason == "stop":
            assert c.token_ids[-1] == eos and eos not in c.token_ids[:-1]
        else:
            assert len(c.token_ids) == 30 and eos not in c.token_ids
    assert {c.finish_reason for c in outputs} == {"stop", "length"}
    ignoring = engine.generate([_request(seed=s, max_new_tokens=30, temperature=1.5, stop_at_eos=False) for s in range(30)])
    assert all(len(c.token_ids) == 30 and c.finish_reason == "length" for c in ignoring.completions)


def test_empty_completion(engine):
    out = engine.generate([_request(max_new_tokens=0)])
    assert out.completions[0].token_ids == () and len(out.completions[0].logp0) == 0
    assert engine.generate([]).completions == []


def test_shared_prefixes_hit_the_prefix_cache(engine):
    long_prompt = tuple(range(1, 20)) * 8  # 152 tokens
    requests = [_request(prompt=long_prompt, prefix=(s,), seed=s) for s in range(1, 9)]
    accounting = engine.generate(requests).accounting
    assert accounting.num_requests == 8
    assert accounting.prompt_tokens == 8 * 153
    assert accounting.cached_prompt_tokens >= 7 * 144  # all but the first reuse the shared blocks
    assert accounting.generated_tokens > 0 and accounting.wall_time_s > 0


def test_toy_distributions_depend_on_more_than_the_last_token():
    engine = ToyEngine(vocab_size=8, eos_token_id=None, seed=0)
    a = engine.next_token_logprobs([1, 2, 3])
    b = engine.next_token_logprobs([4, 2, 3])
    assert not np.allclose(a, b)
    assert np.isclose(np.exp(a).sum(), 1.0)


def test_toy_peakedness_knob():
    flat = ToyEngine(vocab_size=64, seed=0, logit_scale=0.5)
    peaked = ToyEngine(vocab_size=64, seed=0, logit_scale=4.0)
    contexts = [[i, j] for i in range(8) for j in range(8)]
    assert np.mean([peaked.next_token_entropy(c) for c in contexts]) < 0.5 * np.mean([flat.next_token_entropy(c) for c in contexts])


def test_toy_rejects_bad_arguments():
    with pytest.raises(ValueError, match="vocab_size"):
        ToyEngine(vocab_size=1)
    with pytest.raises(ValueError, match="eos_token_id"):
        ToyEngine(vocab_size=4, eos_token_id=4)
