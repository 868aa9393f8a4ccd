"""The vLLM codec without vLLM: requests to SamplingParams keyword arguments, vLLM's outputs (fakes
with the same attributes) to Completions, in both log p0 modes. Runs in the fast tier."""

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from presto_ray.engines.base import ProposalRequest
from presto_ray.engines.vllm.codec import VLLMCodec, cached_tokens, empty_completion, entropies, scored_tokens
from presto_ray.engines.vllm.sampler_columns import SAMPLER_COLUMNS

EOS = 2


def _codec(scores_separately: bool, context_length: int = 64) -> VLLMCodec:
    return VLLMCodec(
        eos_token_id=EOS,
        max_model_len=64,
        context_length=context_length,
        scores_separately=scores_separately,
        params_factory=lambda kwargs, output: {**kwargs, "output": output},
    )


def _request(**kw) -> ProposalRequest:
    return ProposalRequest(**{"prompt_token_ids": (7, 8), "prefix_token_ids": (9,), "max_new_tokens": 4, "temperature": 0.5, "seed": 11, **kw})


def _flat(rows):
    """vLLM's FlatLogprobs: each position's (token id, log-probability) entries, flattened."""
    starts, ends, ids, lps, at = [], [], [], [], 0
    for row in rows:
        starts.append(at)
        at += len(row)
        ends.append(at)
        ids += [t for t, _ in row]
        lps += [lp for _, lp in row]
    return SimpleNamespace(start_indices=starts, end_indices=ends, token_ids=ids, logprobs=lps)


def test_sampling_params_are_q_tau_exactly_with_the_request_s_seed():
    for separately, logprobs in ((False, SAMPLER_COLUMNS - 1), (True, 0)):
        params = _codec(separately).sampling_params(_request(stop_at_eos=False), "delta")
        assert params == {
            "n": 1, "temperature": 0.5, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": 11, "max_tokens": 4,
            "ignore_eos": True, "logprobs": logprobs, "flat_logprobs": not separately, "detokenize": False, "output": "delta",
        }  # fmt: skip
    scoring = _codec(True).scoring_params(_request(want_entropy=True))
    assert scoring["prompt_logprobs"] == -1 and scoring["flat_logprobs"] and scoring["output"] == "final"
    assert _codec(True).scoring_params(_request())["prompt_logprobs"] == 0
    assert VLLMCodec.scoring_prompt(_request(), [5, 6]) == [7, 8, 9, 5, 6]
    assert VLLMCodec.prompt(_request()) == [7, 8, 9]


def test_validate_refuses_empty_contexts_and_requests_over_the_context():
    _codec(False, context_length=7).validate(_request())  # 3 + 4 fits exactly
    with pytest.raises(ValueError, match="at least one prompt or prefix token"):
        _codec(False).validate(_request(prompt_token_ids=(), prefix_token_ids=()))
    with pytest.raises(ValueError, match="exceeds the context of 6 tokens$"):
        _codec(False, context_length=6).validate(_request())
    with pytest.raises(ValueError, match="less the scoring pass's one token"):
        _codec(True, context_length=6).validate(_request())


def test_a_completion_from_the_sampler_s_columns():
    """Columns: log q_tau, log p0, entropy, all under the sampled token; EOS ends with 'stop'."""
    request = _request(want_entropy=True)
    sample = SimpleNamespace(token_ids=[5, EOS], logprobs=_flat([[(5, -0.1), (5, -0.3), (5, 1.5)], [(EOS, -0.2), (EOS, -0.4), (EOS, 0.9)]]))
    output = SimpleNamespace(outputs=[sample], num_cached_tokens=32)
    completion = _codec(False).final_completion(request, output, None)
    assert completion.token_ids == (5, EOS) and completion.finish_reason == "stop"
    np.testing.assert_array_equal(completion.logq, [-0.1, -0.2])
    np.testing.assert_array_equal(completion.logp0, [-0.3, -0.4])
    np.testing.assert_array_equal(completion.entropy, [1.5, 0.9])
    assert completion.cached_prompt_tokens == 32
    no_entropy = _codec(False).final_completion(_request(stop_at_eos=False), output, None)
    assert no_entropy.entropy is None and no_entropy.finish_reason == "length"  # EOS is ordinary in fixed length


def test_a_missing_sampler_column_is_a_clear_error():
    sample = SimpleNamespace(token_ids=[5], logprobs=_flat([[(5, -0.1)]]))
    with pytest.raises(RuntimeError, match="logp0_from to 'scoring_pass'"):
        _codec(False).final_completion(_request(), SimpleNamespace(outputs=[sample], num_cached_tokens=None), None)


def test_a_completion_scored_by_a_second_pass():
    """log q_tau from the sampled output's own log-probabilities, log p0 from the scoring pass's
    prompt rows after the context, entropies from its whole-vocabulary rows."""
    request = _request(want_entropy=True)
    codec = _codec(True)
    columns = codec.token_columns([{5: SimpleNamespace(logprob=-0.1)}, {6: SimpleNamespace(logprob=-0.2)}], [5, 6])
    assert columns.shape == (2, 1)
    vocab = [np.log(0.5), np.log(0.25), np.log(0.25)]
    # positions 0-2: the context (unused); 3 and 4: the completion, its token first, then the vocabulary
    flat = _flat([[(7, 0.0)], [(8, 0.0)], [(9, 0.0)]] + [[(t, vocab[t])] + list(enumerate(vocab)) for t in (0, 1)])
    score = SimpleNamespace(prompt_token_ids=[7, 8, 9, 5, 6], prompt_logprobs=_ScoreRows(flat, {3: {5: -0.7}, 4: {6: -0.8}}))
    completion = codec.completion(request, (5, 6), columns, score, cached=0)
    np.testing.assert_array_equal(completion.logq, [-0.1, -0.2])
    np.testing.assert_array_equal(completion.logp0, [-0.7, -0.8])
    h = -sum(np.exp(lp) * lp for lp in vocab)
    np.testing.assert_allclose(completion.entropy, [h, h])
    assert scored_tokens(score) == 5 and scored_tokens(None) == 0


class _ScoreRows:
    """A scoring pass's prompt_logprobs: indexable by position (token -> logprob) and flat."""

    def __init__(self, flat, rows):
        self.start_indices, self.end_indices = flat.start_indices, flat.end_indices
        self.token_ids, self.logprobs = flat.token_ids, flat.logprobs
        self._rows = rows

    def __getitem__(self, position):
        return {t: SimpleNamespace(logprob=lp) for t, lp in self._rows[position].items()}


def test_entropies_keep_the_first_entry_of_the_repeated_prompt_token():
    vocab = [np.log(0.7), np.log(0.2), np.log(0.1)]
    flat = _flat([[(1, vocab[1])] + list(enumerate(vocab))])
    np.testing.assert_allclose(entropies(flat, 0, 1), [-sum(np.exp(lp) * lp for lp in vocab)])
    assert entropies(flat, 0, 0).shape == (0,)


def test_small_readers():
    assert cached_tokens(SimpleNamespace(num_cached_tokens=None)) == 0
    assert empty_completion().token_ids == () and empty_completion().finish_reason == "length"


def test_the_vllm_package_imports_without_vllm_or_torch():
    """Specs, the config, the codec and the engine's modules import; vLLM loads only when an engine
    starts (the import-linter contract checks the modules, this the running interpreter)."""
    code = (
        "import sys, presto_ray.engines, presto_ray.engines.vllm, presto_ray.engines.vllm.codec, presto_ray.engines.vllm.streaming;"
        "print(sorted(m for m in ('vllm', 'torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
