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


# --- exact early rejection: the reader's stop rule (codec.TokenReader) ----------------------------
def _bound(log_accept_uniform: float, **kw):
    """A uniform-cut bound at cut 0 from an empty suffix: U_m = S_m - log(max(m, 1)), S_m the clamped
    sum of 4 log p0 - log q over the first m tokens."""
    from presto_ray.early_rejection import RejectionBound

    return RejectionBound(alpha=4.0, log_accept_uniform=log_accept_uniform, cut=0, current_weight=0.0, current_cut_log_prob=0.0, **kw)


def _delta(tokens, logq, logp0, entropy=None, cached=None):
    """One DELTA output of the wrapped sampler: three columns under each sampled token."""
    entropy = entropy or [1.0] * len(tokens)
    rows = [[(t, q), (t, p), (t, h)] for t, q, p, h in zip(tokens, logq, logp0, entropy)]
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=list(tokens), logprobs=_flat(rows))], num_cached_tokens=cached)


def test_the_reader_stops_at_the_token_where_every_bound_rejects_and_drops_the_rest():
    """g = 4 log p0 - log q per token is -0.2, -0.3, -0.4, ...: with log V = -1.2 and U_m = S_m -
    log m, U_1 = -0.2, U_2 = -0.5 - log 2 = -1.19, U_3 = -0.9 - log 3 = -2.0: the stop fires at the
    3rd token, in the middle of the second delta, whose 4th token is dropped (but counted)."""
    from presto_ray.engines.vllm.codec import TokenReader

    codec = _codec(False)
    request = _request(max_new_tokens=8, rejection_bounds=(_bound(-1.2),))
    reader = TokenReader(codec, request)
    assert reader.can_stop and reader.output_kind == "delta"
    reader.read(_delta([5], [-0.2], [-0.1], cached=32))
    assert not reader.stopped and reader.tokens == [5]
    reader.read(_delta([6, 7, 8], [-0.2, -0.2, -0.2], [-0.125, -0.15, -0.175]))
    assert reader.stopped and reader.tokens == [5, 6, 7] and reader.decoded == 4
    reader.read(_delta([9], [-0.2], [-0.1]))  # late outputs change nothing but the count
    assert reader.tokens == [5, 6, 7] and reader.decoded == 5
    completion = reader.completion(None)
    assert completion.finish_reason == "rejected" and completion.stopped_early and completion.token_ids == (5, 6, 7)
    np.testing.assert_array_equal(completion.logp0, [-0.1, -0.125, -0.15])
    assert completion.cached_prompt_tokens == 32
    # the pushed values are the Completion's: the bound rejects exactly its 3 tokens, not its first 2
    assert request.rejection_bounds[0].rejects_prefix(completion.logp0, completion.logq)
    assert not request.rejection_bounds[0].rejects_prefix(completion.logp0[:2], completion.logq[:2])
    # the same outputs read as one FINAL output: the same completion
    final = _codec(False).final_completion(request, _delta([5, 6, 7, 8], [-0.2] * 4, [-0.1, -0.125, -0.15, -0.175]), None)
    assert final.token_ids == completion.token_ids and final.finish_reason == "rejected"


def test_the_reader_never_stops_a_natural_end_nor_without_every_bound():
    from presto_ray.engines.vllm.codec import TokenReader

    rejects_at_once, never = _bound(10.0), _bound(-1e9)
    logq, logp0 = [-0.2] * 3, [-0.1] * 3
    # EOS where the request stops at EOS: a natural end, even though the bound rejects it
    at_eos = TokenReader(_codec(False), _request(max_new_tokens=8, rejection_bounds=(rejects_at_once,)))
    at_eos.read(_delta([EOS], logq[:1], logp0[:1]))
    assert not at_eos.stopped and at_eos.completion(None).finish_reason == "stop"
    # in fixed length EOS is an ordinary token: the stop fires on it
    fixed = TokenReader(_codec(False), _request(max_new_tokens=8, stop_at_eos=False, rejection_bounds=(rejects_at_once,)))
    fixed.read(_delta([EOS, 5], logq[:2], logp0[:2]))
    assert fixed.stopped and fixed.tokens == [EOS]
    # the max_new_tokens-th token ends the request: "length", not "rejected"
    last = TokenReader(_codec(False), _request(max_new_tokens=1, rejection_bounds=(rejects_at_once,)))
    last.read(_delta([5], logq[:1], logp0[:1]))
    assert not last.stopped and last.completion(None).finish_reason == "length"
    # one bound of two rejects: the request runs on
    shared = TokenReader(_codec(False), _request(max_new_tokens=8, rejection_bounds=(rejects_at_once, never)))
    shared.read(_delta([5, 6, 7], logq, logp0))
    assert not shared.stopped and shared.tokens == [5, 6, 7]
    # no bounds: FINAL outputs, never stopped
    plain = TokenReader(_codec(False), _request(max_new_tokens=8))
    assert not plain.can_stop and plain.output_kind == "final"
    # a scoring pass: log p0 comes after the proposal, so its bounds are ignored
    scored = TokenReader(_codec(True), _request(max_new_tokens=8, rejection_bounds=(rejects_at_once,)))
    assert not scored.can_stop and scored.output_kind == "final"
    scored.read(SimpleNamespace(outputs=[SimpleNamespace(token_ids=[5, 6], logprobs=[{5: SimpleNamespace(logprob=-0.1)}, {6: SimpleNamespace(logprob=-0.2)}])], num_cached_tokens=0))
    assert not scored.stopped and scored.tokens == [5, 6] and scored.columns().shape == (2, 1)
    # an abort's last output has no tokens (and may have no log-probabilities)
    plain.read(SimpleNamespace(outputs=[SimpleNamespace(token_ids=[], logprobs=None)], num_cached_tokens=None))
    assert plain.tokens == [] and plain.completion(None).token_ids == ()


def test_the_reader_pushes_the_entropy_only_where_the_completion_holds_it():
    """EntropyCut's bound reads each position's entropy: the Completion's (the entropy column when
    the request wants entropies; none, i.e. 0 in the chain, otherwise). Every g is 0 and log V is
    -0.5: with entropies 3.0, 0.1, 0.1 the cut position holds all the jump mass, so the bound stays
    at 0 and never rejects; with none the cut law is uniform and U_2 = -log 2 rejects."""
    from presto_ray.engines.vllm.codec import TokenReader

    bound = _bound(-0.5, entropy_beta=1.0)
    tokens, logq, logp0, entropy = [5, 6, 7], [-0.2] * 3, [-0.05] * 3, [3.0, 0.1, 0.1]
    for want, length in ((True, 3), (False, 2)):
        reader = TokenReader(_codec(False), _request(max_new_tokens=8, want_entropy=want, rejection_bounds=(bound,)))
        reader.read(_delta(tokens, logq, logp0, entropy))
        completion = reader.completion(None)
        assert len(completion.token_ids) == length and reader.stopped == (length < 3), want
        assert bound.rejects_prefix(completion.logp0, completion.logq, completion.entropy) == reader.stopped


def test_new_bounds_follow_the_tokens_read_so_far_and_stop_at_once_where_they_reject():
    """The streaming form's set_rejection_bounds: the new rule replays the tokens the request has
    (same g = -0.2, -0.3, -0.4, ... as above, so log V = -1.2 rejects from the 3rd token on)."""
    from presto_ray.engines.vllm.codec import TokenReader

    logq, logp0 = [-0.2] * 5, [-0.1, -0.125, -0.15, -0.175, -0.2]
    reader = TokenReader(_codec(False), _request(max_new_tokens=8))
    reader.read(_delta([5, 6], logq[:2], logp0[:2]))
    assert not reader.set_bounds((_bound(-1.2),)) and reader.can_stop  # U_2 = -1.19 > -1.2: runs on
    reader.read(_delta([7, 8], logq[2:4], logp0[2:4]))  # ... and stops at the 3rd token as it arrives
    assert reader.stopped and reader.tokens == [5, 6, 7]
    assert not reader.set_bounds(()) and reader.stopped  # a stop stays: its abort is under way

    late = TokenReader(_codec(False), _request(max_new_tokens=8))
    late.read(_delta([5, 6, 7, 8], logq[:4], logp0[:4]))
    assert late.set_bounds((_bound(-1.2),)) and late.stopped
    assert late.tokens == [5, 6, 7, 8]  # every token it has: never fewer than it has shown
    assert late.completion(None).finish_reason == "rejected"
    # bounds that reject nothing, or none at all: it runs to its end
    for bounds in ((_bound(-1e9),), ()):
        plain = TokenReader(_codec(False), _request(max_new_tokens=8, rejection_bounds=(_bound(10.0),) if bounds else ()))
        plain.set_bounds(bounds)
        plain.read(_delta([5, 6, 7], logq[:3], logp0[:3]))
        assert not plain.stopped and plain.tokens == [5, 6, 7] and plain.can_stop == bool(bounds)
    # tokens that end the request naturally are not stopped
    full = TokenReader(_codec(False), _request(max_new_tokens=4))
    full.read(_delta([5, 6, 7, 8], logq[:4], logp0[:4]))
    assert not full.set_bounds((_bound(10.0),)) and full.completion(None).finish_reason == "length"
    at_eos = TokenReader(_codec(False), _request(max_new_tokens=8))
    at_eos.read(_delta([5, EOS], logq[:2], logp0[:2]))
    assert not at_eos.set_bounds((_bound(10.0),)) and at_eos.completion(None).finish_reason == "stop"
    # a scoring pass: bounds are ignored
    scored = TokenReader(_codec(True), _request(max_new_tokens=8))
    assert not scored.set_bounds((_bound(10.0),)) and not scored.can_stop
