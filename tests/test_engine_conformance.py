"""The engine contract, run on every engine: the exact toy model, and vLLM and transformers with a
real model."""

import numpy as np
import pytest

from presto_ray.engines.base import Engine, ProposalRequest
from presto_ray.engines.toy import ToyEngine
from transformers_helpers import hf_reference, module_engine
from vllm_settings import KV_CACHE_GIB

# Per-token tolerance on log-probabilities against the reference. The toy engine is compared with
# its own exact tables; vLLM and the transformers engine (fp32, CPU) with transformers' own forward
# on the same weights, where the implementations differ only by float32 round-off (measured below
# 1e-4).
TOLERANCE = {"toy": 1e-9, "vllm": 2e-3, "transformers": 1e-3}


def toy_reference(engine):
    def logprobs(context, tokens, temperature, entropy=False):
        logp0, logq, entropies = [], [], []
        for i, token in enumerate(tokens):
            lp = engine.next_token_logprobs(list(context) + list(tokens[:i]))
            z = lp / temperature
            logp0.append(lp[token])
            logq.append(z[token] - np.logaddexp.reduce(z))
            entropies.append(-(np.exp(lp) * lp).sum())
        if entropy:
            return np.array(logp0), np.array(logq), np.array(entropies)
        return np.array(logp0), np.array(logq)

    return logprobs


@pytest.fixture(scope="module")
def vllm_scoring_pass_engine(vllm_engine):
    """A second vLLM engine whose log p0 comes from the scoring pass (its sampler unwrapped), for
    this module only: the session's engine takes log p0 from the sampler."""
    from presto_ray.engines.specs import VLLMEngineConfig
    from presto_ray.engines.vllm import VLLMEngine

    engine = VLLMEngine(VLLMEngineConfig(logp0_from="scoring_pass", max_num_seqs=16, kv_cache_gib=KV_CACHE_GIB / 2))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def transformers_engine():
    """The transformers engine on SmolLM2 on the CPU (batch-invariant, the CPU default)."""
    yield from module_engine()


@pytest.fixture(scope="module")
def transformers_reference(transformers_engine):
    return hf_reference(transformers_engine.model_dir)


@pytest.fixture(
    params=[
        "toy",
        pytest.param("vllm", marks=pytest.mark.vllm),
        pytest.param("vllm-scoring-pass", marks=pytest.mark.vllm),
        pytest.param("transformers", marks=pytest.mark.transformers),
    ]
)
def setup(request):
    """(name, engine, reference log-probabilities, a prompt of real tokens)."""
    if request.param == "toy":
        engine = ToyEngine(vocab_size=24, eos_token_id=0, seed=4, logit_scale=2.0, eos_bias=-1.0)
        return "toy", engine, toy_reference(engine), (1, 2, 5, 7)
    if request.param == "transformers":
        engine = request.getfixturevalue("transformers_engine")
        prompt = tuple(engine.tokenizer.encode("What is the capital of France?"))
        return "transformers", engine, request.getfixturevalue("transformers_reference"), prompt
    engine = request.getfixturevalue("vllm_engine" if request.param == "vllm" else "vllm_scoring_pass_engine")
    prompt = tuple(engine.tokenizer.encode("What is the capital of France?"))
    return "vllm", engine, request.getfixturevalue("hf_reference"), prompt


def _request(prompt, prefix=(), seed=11, max_new_tokens=12, temperature=0.5, stop_at_eos=True, want_entropy=False):
    return ProposalRequest(tuple(prompt), tuple(prefix), max_new_tokens, temperature, seed, stop_at_eos, want_entropy)


def test_logprobs_match_the_reference(setup):
    name, engine, reference, prompt = setup
    requests = [_request(prompt, seed=s, temperature=t) for s in range(3) for t in (0.25, 1.0)]
    worst = 0.0
    for request, completion in zip(requests, engine.generate(requests).completions):
        assert len(completion.token_ids) > 0
        logp0, logq = reference(request.context_token_ids, completion.token_ids, request.temperature)
        worst = max(worst, np.abs(completion.logp0 - logp0).max(), np.abs(completion.logq - logq).max())
    assert worst < TOLERANCE[name], f"{name}: max |delta logprob| = {worst:.2e}"


def test_entropies_match_the_reference(setup):
    name, engine, reference, prompt = setup
    requests = [_request(prompt, seed=s, max_new_tokens=6, want_entropy=True) for s in range(2)]
    requests.append(_request(prompt, seed=7, max_new_tokens=6))  # entropies only where asked
    out = engine.generate(requests).completions
    for request, completion in zip(requests[:2], out):
        _, _, entropy = reference(request.context_token_ids, completion.token_ids, request.temperature, entropy=True)
        np.testing.assert_allclose(completion.entropy, entropy, atol=TOLERANCE[name])
    assert name == "toy" or out[2].entropy is None


def test_same_key_same_tokens_whatever_the_batch(setup):
    name, engine, _, prompt = setup
    alone = engine.generate([_request(prompt, seed=5)]).completions[0]
    batch = engine.generate(
        [_request(prompt, seed=9), _request(prompt, seed=5), _request(prompt, prefix=prompt[:1], seed=5)]
    ).completions
    assert batch[1].token_ids == alone.token_ids
    np.testing.assert_allclose(batch[1].logq, alone.logq, atol=TOLERANCE[name])
    others = {c.token_ids for c in engine.generate([_request(prompt, seed=s, temperature=1.0) for s in range(6)]).completions}
    assert len(others) > 1  # the seed matters


def test_eos_and_max_tokens(setup):
    _, engine, _, prompt = setup
    eos = engine.eos_token_id
    requests = [_request(prompt, seed=s, max_new_tokens=n, temperature=1.0) for s in range(6) for n in (2, 40)]
    outputs = engine.generate(requests).completions
    for request, c in zip(requests, outputs):
        assert 1 <= len(c.token_ids) <= request.max_new_tokens
        if c.finish_reason == "stop":
            assert c.token_ids[-1] == eos and eos not in c.token_ids[:-1]
        else:
            assert len(c.token_ids) == request.max_new_tokens and eos not in c.token_ids
    assert {c.finish_reason for c in outputs} == {"stop", "length"}
    ignoring = engine.generate([_request(prompt, seed=s, max_new_tokens=40, temperature=1.0, stop_at_eos=False) for s in range(3)])
    assert all(len(c.token_ids) == 40 and c.finish_reason == "length" for c in ignoring.completions)


def test_empty_completion(setup):
    _, engine, _, prompt = setup
    out = engine.generate([_request(prompt, max_new_tokens=0), _request(prompt, max_new_tokens=1)])
    assert out.completions[0].token_ids == () and len(out.completions[0].logp0) == 0
    assert len(out.completions[1].token_ids) == 1
    assert engine.generate([]).completions == []


def test_shared_prefixes_hit_the_prefix_cache(setup):
    _, engine, _, prompt = setup
    long_prompt = tuple(prompt) * (160 // len(prompt) + 1)  # > 4 KV blocks of 32 tokens
    engine.generate([_request(long_prompt, seed=1, max_new_tokens=1)])  # the root state's earlier round
    out = engine.generate([_request(long_prompt, prefix=(prompt[i % len(prompt)],), seed=i, max_new_tokens=4) for i in range(8)])
    assert out.accounting.num_requests == 8 and out.accounting.calls == 1
    assert out.accounting.prompt_tokens == 8 * (len(long_prompt) + 1)
    assert all(c.cached_prompt_tokens >= 128 for c in out.completions), [c.cached_prompt_tokens for c in out.completions]
    assert out.accounting.cached_prompt_tokens == sum(c.cached_prompt_tokens for c in out.completions)
    assert out.accounting.generated_tokens > 0 and out.accounting.wall_time_s > 0


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


@pytest.fixture
def toy_engine():
    return ToyEngine(vocab_size=24, eos_token_id=0, seed=4, logit_scale=2.0, eos_bias=-1.0)


@pytest.mark.parametrize(
    "engine_fixture",
    [
        "toy_engine",
        pytest.param("vllm_engine", marks=pytest.mark.vllm),
        pytest.param("vllm_scoring_pass_engine", marks=pytest.mark.vllm),
        pytest.param("transformers_engine", marks=pytest.mark.transformers),
    ],
)
def test_a_streamed_request_completes_as_the_batch_path_does(request, engine_fixture):
    """The streaming form (base.StreamingEngine) gives the batch path's completion: on vLLM it takes
    log p0 from the same source (the sampler's columns of each DELTA output, or the scoring pass
    when the request ends); its accounting counts the request, its tokens and its scoring."""
    engine = request.getfixturevalue(engine_fixture)
    assert isinstance(engine, Engine)
    prompt = tuple(engine.tokenizer.encode("What is the capital of France?"))
    proposal = _request(prompt, seed=3, max_new_tokens=10, temperature=0.5, stop_at_eos=False)
    (batch,) = engine.generate([proposal]).completions
    stream = engine.streaming()
    before = stream.accounting()
    handle = stream.submit(proposal)
    done = None
    while done is None:
        done = next((e.completion for e in stream.advance() if e.handle == handle and e.completion is not None), None)
    assert done.token_ids == batch.token_ids
    np.testing.assert_allclose(done.logp0, batch.logp0, atol=1e-4)
    np.testing.assert_allclose(done.logq, batch.logq, atol=1e-4)
    spent = stream.accounting().minus(before)
    assert spent.num_requests == 1 and spent.prompt_tokens == len(prompt)
    assert spent.generated_tokens == len(done.token_ids) == 10
    assert (spent.scoring_tokens > 0) == (engine_fixture == "vllm_scoring_pass_engine")
    assert not stream.busy
