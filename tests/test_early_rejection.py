"""Exact early rejection (docs/samplers.md#exact-early-rejection): the bound after m proposal tokens
never rejects a step the full transition would accept, in floating point, noise included."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from presto_ray import SamplerConfig, sample
from presto_ray.early_rejection import RequestStop, clamped_log_weights, stop_length
from presto_ray.engines.base import Completion, ProposalRequest
from presto_ray.engines.toy import ToyEngine
from presto_ray.kernels import EntropyCut, MultiTryKernel, PowerMHKernel, UniformCut, build_kernel
from presto_ray.keys import StepKeys, step_keys
from presto_ray.state import ChainState

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _log_softmax(z: np.ndarray) -> np.ndarray:
    m = z.max()
    return z - (m + np.log(np.exp(z - m).sum()))


@dataclass
class Case:
    kernel: PowerMHKernel
    state: ChainState
    cut: int
    proposal: Completion
    candidate_length: int | None  # fixed length: |y| known in advance


def _positions(rng, logits: np.ndarray, tau: float, entropy_mode: str):
    """(tokens, log p0, log q_tau, entropy) of tokens drawn from q_tau = softmax(logits / tau)."""
    tokens, logp0, logq, entropy = [], [], [], []
    for i, z in enumerate(logits):
        lp, lq = _log_softmax(z), _log_softmax(z / tau)
        token = int(rng.choice(len(z), p=np.exp(lq) / np.exp(lq).sum()))
        tokens.append(token)
        logp0.append(lp[token])
        logq.append(lq[token])
        entropy.append({"model": float(-(np.exp(lp) * lp).sum()), "zeros": 0.0, "falling": 5.0 - i}[entropy_mode])
    return tuple(tokens), np.array(logp0), np.array(logq), np.array(entropy)


def _perturb(rng, values: np.ndarray, scale: float) -> np.ndarray:
    """Float noise of an engine's logits: makes some g a hair above 0."""
    return values + rng.uniform(-scale, scale, len(values)) * np.maximum(1.0, np.abs(values))


def _inject(rng, logp0, logq, entropy):
    """Impossible tokens and broken values: log p0 = -inf, log q = -inf, both, a nan entropy."""
    for array, value in ((logp0, -math.inf), (logq, -math.inf), (entropy, math.nan)):
        if len(array) and rng.random() < 0.3:
            array[rng.integers(len(array))] = value


@st.composite
def cases(draw, sampler: str, bounded: bool = True):
    alpha = draw(st.sampled_from([1.0, 2.0, 4.0, 8.0]))
    if bounded:
        tau = draw(st.sampled_from([1.0 / alpha, 0.5 * (1.0 / alpha + 1.0), 1.0]))
    else:
        tau = draw(st.sampled_from([0.5 / alpha, 0.9 / alpha, 1.5, 3.0])) if alpha > 1.0 else 2.0
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    vocab, scale = draw(st.integers(2, 8)), draw(st.sampled_from([0.5, 2.0, 6.0]))
    noise = draw(st.sampled_from([0.0, 1e-15, 1e-12, 1e-9]))
    inject = draw(st.integers(0, 4)) == 0
    entropy_mode = draw(st.sampled_from(["model", "model", "zeros", "falling"]))
    cut_law = EntropyCut(draw(st.sampled_from([1.0, 4.0]))) if sampler == "entropy_cut" else UniformCut()

    def arrays(logits):
        tokens, logp0, logq, entropy = _positions(rng, logits, tau, entropy_mode)
        if noise:
            logp0, logq = _perturb(rng, logp0, noise), _perturb(rng, logq, noise)
        if inject:
            _inject(rng, logp0, logq, entropy)
        return tokens, logp0, logq, entropy

    n = draw(st.integers(1, 12))
    x_logits = scale * rng.standard_normal((n, vocab))
    state = ChainState(*arrays(x_logits))
    if sampler == "entropy_cut" and draw(st.booleans()):
        cut = cut_law.draw(draw(st.floats(0.0, 1.0, exclude_max=True)), state)  # a cut the chain would draw
    else:
        cut = draw(st.integers(0, n - 1))
    fixed = draw(st.booleans())
    k = n - cut if fixed else draw(st.integers(1, 12))
    y_logits = scale * rng.standard_normal((k, vocab))
    if draw(st.booleans()):
        y_logits[0] = x_logits[cut]  # y's first position has x[:cut] as context, as x's position cut does
    tokens, logp0, logq, entropy = arrays(y_logits)
    proposal = Completion(tokens, logp0, logq, "length", entropy=entropy)
    return Case(PowerMHKernel(alpha, cut_law, tau), state, cut, proposal, cut + k if fixed else None)


def _uniforms_around(target: float) -> list[float]:
    """Acceptance uniforms V in (0, 1) with log V just below and at-or-just-above `target`."""
    if not math.isfinite(target) or target >= 0.0 or target < -700.0:
        return []
    below: list[float] = []
    above: list[float] = []
    v = math.exp(target)
    for _ in range(8):
        (below if math.log(v) < target else above).append(v)
        v = math.nextafter(v, 0.0)
    v = math.exp(target)
    for _ in range(8):
        v = math.nextafter(v, 1.0)
        (below if math.log(v) < target else above).append(v)
    return [max(below, default=v), min(above, default=v)]


def _uniforms(case: Case, extra: float) -> list[float]:
    """The sharpest uniforms: at the full ratio and at every prefix bound, plus one at random."""
    full = case.kernel.log_accept_ratio(case.state, case.cut, case.proposal)
    bound = case.kernel.rejection_bound(case.state, case.cut, 0.5, case.candidate_length)
    assert bound is not None
    targets = [full] + [_prefix_bound(bound, case.proposal, m) for m in range(len(case.proposal.token_ids) + 1)]
    return [extra] + [v for t in targets for v in _uniforms_around(t) if 0.0 < v < 1.0]


def _prefix_bound(bound, proposal: Completion, m: int) -> float:
    entropy = None if proposal.entropy is None else proposal.entropy[:m]
    return bound.prefix_log_ratio_bound(proposal.logp0[:m], proposal.logq[:m], entropy)


def _keys(accept_uniform: float) -> StepKeys:
    return StepKeys(cut_uniform=0.5, accept_uniform=accept_uniform, proposal_seed=0, selection_uniform=0.5)


def _check_sound(case: Case, extra: float) -> None:
    for v in _uniforms(case, extra):
        bound = case.kernel.rejection_bound(case.state, case.cut, v, case.candidate_length)
        assert bound is not None
        accepted = case.kernel.transition(case.state, case.cut, [case.proposal], _keys(v)).accepted
        running, entropies = bound.start(), case.proposal.entropy
        assert entropies is not None
        for m in range(len(case.proposal.token_ids) + 1):
            entropy = None if case.proposal.entropy is None else case.proposal.entropy[:m]
            certain = bound.rejects_prefix(case.proposal.logp0[:m], case.proposal.logq[:m], entropy)
            assert not (certain and accepted), f"rejected after {m} tokens, but the full ratio accepts (V = {v!r})"
            if m:  # the engine's incremental check decides as the array form does
                assert running.push(case.proposal.logp0[m - 1], case.proposal.logq[m - 1], entropies[m - 1]) == certain


@SETTINGS
@given(st.sampled_from(["power_mh", "entropy_cut"]).flatmap(cases), st.floats(1e-300, 1.0, exclude_max=True), st.integers(1, 3))
def test_stop_length_in_array_operations_is_the_token_by_token_one(case, extra, count):
    """The virtual clock's `stop_length` (array operations for the uniform cut) stops a request
    where `RequestStop` pushing token by token does, for one to three bounds at the sharpest
    uniforms; EntropyCut's bounds go token by token in both."""
    uniforms = _uniforms(case, extra)
    bounds = [case.kernel.rejection_bound(case.state, case.cut, v, case.candidate_length) for v in uniforms]
    proposal = case.proposal
    for start in range(len(bounds)):
        chosen = tuple(b for b in bounds[start : start + count] if b is not None)
        want = RequestStop(chosen).stop_length(proposal.logp0, proposal.logq, proposal.entropy)
        assert stop_length(chosen, proposal.logp0, proposal.logq, proposal.entropy) == want
        if len(chosen) == 1 and chosen[0].entropy_beta is None:
            assert chosen[0].first_rejection(proposal.logp0, proposal.logq) == want


@SETTINGS
@given(st.sampled_from(["power_mh", "entropy_cut"]).flatmap(cases), st.floats(1e-300, 1.0, exclude_max=True))
def test_a_prefix_bound_from_arrays_is_the_running_bound_bit_for_bit(case, v):
    """`prefix_log_ratio_bound` (array operations for the uniform cut: the walk's check of a
    stopped proposal) is the float `RunningBound` reaches pushing the same tokens one by one (the
    engine's check), after every prefix: sign of zero and nan included."""
    bound = case.kernel.rejection_bound(case.state, case.cut, v, case.candidate_length)
    assert bound is not None
    proposal, running = case.proposal, bound.start()
    assert proposal.entropy is not None
    for m in range(len(proposal.token_ids) + 1):
        if m:
            running.push(proposal.logp0[m - 1], proposal.logq[m - 1], proposal.entropy[m - 1])
        got = bound.prefix_log_ratio_bound(proposal.logp0[:m], proposal.logq[:m], proposal.entropy[:m])
        assert repr(got) == repr(running.log_ratio_bound())


# --- (1) soundness ---------------------------------------------------------------------
@SETTINGS
@given(cases("power_mh"), st.floats(1e-300, 1.0, exclude_max=True))
def test_power_mh_bound_never_rejects_an_accepted_step(case, v):
    _check_sound(case, v)


@SETTINGS
@given(cases("entropy_cut"), st.floats(1e-300, 1.0, exclude_max=True))
def test_entropy_cut_bound_never_rejects_an_accepted_step(case, v):
    _check_sound(case, v)


@SETTINGS
@given(st.sampled_from(["power_mh", "entropy_cut"]).flatmap(cases))
def test_bound_after_the_whole_proposal_is_at_least_the_ratio(case):
    full = case.kernel.log_accept_ratio(case.state, case.cut, case.proposal)
    bound = case.kernel.rejection_bound(case.state, case.cut, 0.5, case.candidate_length)
    assert bound is not None
    last = _prefix_bound(bound, case.proposal, len(case.proposal.token_ids))
    if not math.isnan(full) and not math.isnan(last):
        assert last >= full
    if isinstance(case.kernel.cut_law, UniformCut) and not math.isnan(full):
        assert last == full  # |y| = cut + m once it ended: the bound is the kernel's own expression


def test_a_bound_without_clamping_would_reject_an_accepted_step():
    """Why the kernel clamps: with float noise making a token's g = +1e-9, summing raw g's gives a
    bound below the final ratio (the naive bound rejects, the naive ratio accepts)."""
    alpha, tau = 2.0, 0.5
    state = ChainState((1, 1), np.array([-0.125, -0.125]), np.zeros(2), np.zeros(2))  # g(x) = -0.25, -0.25
    proposal = Completion((1, 2), np.array([-0.5, 1e-9 / alpha]), np.zeros(2), "length")  # g = -1, +1e-9
    v = math.exp(-0.5)
    naive_after_one = alpha * proposal.logp0[0] - alpha * state.logp0.sum()  # equal lengths: no cut term
    naive_full = PowerMHKernel(alpha).log_accept_ratio(state, 0, proposal)  # today's unclamped ratio
    assert not math.log(v) < naive_after_one and math.log(v) < naive_full  # the naive pair disagrees
    kernel = PowerMHKernel(alpha, tau=tau)
    bound = kernel.rejection_bound(state, 0, v, candidate_length=2)
    assert bound is not None and bound.rejects_prefix(proposal.logp0[:1], proposal.logq[:1])
    assert not kernel.transition(state, 0, [proposal], _keys(v)).accepted  # the clamped ratio agrees


def _entropy_case(x_entropy, cut, y_entropy, alpha=4.0) -> Case:
    n, k = len(x_entropy), len(y_entropy)
    state = ChainState((1,) * n, np.full(n, -0.1), np.full(n, -0.3), np.array(x_entropy, dtype=float))
    proposal = Completion((2,) * k, np.full(k, -0.1), np.full(k, -0.3), "length", entropy=np.array(y_entropy, dtype=float))
    return Case(PowerMHKernel(alpha, EntropyCut(4.0), 1.0 / alpha), state, cut, proposal, None)


@pytest.mark.parametrize(
    "x_entropy, cut, y_entropy, final",
    [
        ([3.0, 3.01, 3.0], 1, [3.01, 5.0, math.nan, 1.0], -math.log(5)),  # a nan later: the law is uniform
        ([3.0, 3.01, 3.0], 1, [3.01, 5.0, 1.0, 2.0], None),  # the cut's small share, a large jump after it
        ([0.0, 0.0, 0.0], 1, [0.0, 0.0, 0.0], -math.log(4)),  # every jump 0: uniform
        ([0.0, 0.0, 0.0], 1, [0.0, 0.0, 2.0], -math.inf),  # the cut's weight 0 in y: cannot be reversed
    ],
)
def test_entropy_cut_fallbacks_of_the_cut_law(x_entropy, cut, y_entropy, final):
    """The cases where lambda(cut; y) is not first_jump / W_y: the bound covers each."""
    case = _entropy_case(x_entropy, cut, y_entropy)
    candidate = case.state.replace_suffix(cut, case.proposal)
    if final is not None:
        assert case.kernel.cut_law.log_prob_in_order(cut, candidate) == final
    _check_sound(case, 0.5)
    assert all(u >= case.kernel.log_accept_ratio(case.state, cut, case.proposal) for u in _all_bounds(case))


def _all_bounds(case: Case) -> list[float]:
    bound = case.kernel.rejection_bound(case.state, case.cut, 0.5, case.candidate_length)
    assert bound is not None
    return [_prefix_bound(bound, case.proposal, m) for m in range(len(case.proposal.token_ids) + 1)]


# --- (2) monotone in m -------------------------------------------------------------------
@SETTINGS
@given(st.sampled_from(["power_mh", "entropy_cut"]).flatmap(cases))
def test_bound_never_increases_with_more_tokens(case):
    bound = case.kernel.rejection_bound(case.state, case.cut, 0.5, case.candidate_length)
    assert bound is not None
    values = [_prefix_bound(bound, case.proposal, m) for m in range(len(case.proposal.token_ids) + 1)]
    values = [-math.inf if math.isnan(u) else u for u in values]  # nan decides as -inf: rejected
    assert all(later <= earlier for earlier, later in zip(values, values[1:])), values


# --- (3) no bound where none holds ---------------------------------------------------------
@SETTINGS
@given(st.sampled_from(["power_mh", "entropy_cut"]).flatmap(lambda s: cases(s, bounded=False)))
def test_no_bound_outside_the_temperature_range_and_the_ratio_is_unchanged(case):
    assert not case.kernel.clamped_ratio
    assert case.kernel.rejection_bound(case.state, case.cut, 0.5) is None
    old = PowerMHKernel(case.kernel.alpha, case.kernel.cut_law)  # no tau: the ratio as it always was
    new_ratio = case.kernel.log_accept_ratio(case.state, case.cut, case.proposal)
    old_ratio = old.log_accept_ratio(case.state, case.cut, case.proposal)
    assert new_ratio == old_ratio or (math.isnan(new_ratio) and math.isnan(old_ratio))  # bit for bit


@SETTINGS
@given(st.sampled_from(["power_mh", "entropy_cut"]).flatmap(cases))
def test_no_bound_for_multi_try_and_its_ratio_is_unchanged(case):
    cut_law, alpha, tau = case.kernel.cut_law, case.kernel.alpha, case.kernel.tau
    kernel, old = MultiTryKernel(alpha, 2, cut_law, tau), MultiTryKernel(alpha, 2, cut_law)
    assert not kernel.clamped_ratio and kernel.rejection_bound(case.state, case.cut, 0.5) is None
    tries = [case.proposal, case.proposal]
    for v in (0.01, 0.5, 0.99):
        keys = _keys(v)
        new, before = kernel.transition(case.state, case.cut, tries, keys), old.transition(case.state, case.cut, tries, keys)
        assert new.accepted == before.accepted
        assert new.log_ratio == before.log_ratio or (math.isnan(new.log_ratio) and math.isnan(before.log_ratio))


def test_no_bound_without_tau_or_for_a_kernel_with_its_own_ratio():
    state = ChainState((1, 2), np.array([-0.1, -0.2]), np.array([-0.05, -0.1]), np.array([1.0, 2.0]))
    assert PowerMHKernel(4.0).rejection_bound(state, 0, 0.5) is None  # tau unknown

    class NoCutCorrection(PowerMHKernel):
        def cut_correction(self, state, cut, candidate) -> float:
            return 0.0

    assert NoCutCorrection(4.0, tau=0.25).rejection_bound(state, 0, 0.5) is None
    assert build_kernel(SamplerConfig(sampler="multi_try")).rejection_bound(state, 0, 0.5) is None
    assert build_kernel(SamplerConfig(alpha=4.0, proposal_temperature=0.2)).rejection_bound(state, 0, 0.5) is None
    assert build_kernel(SamplerConfig(alpha=4.0)).rejection_bound(state, 0, 0.5) is not None  # tau = 1/alpha
    assert build_kernel(SamplerConfig(sampler="entropy_cut")).rejection_bound(state, 1, 0.5) is not None


# --- (4) the clamped ratio is the same law -------------------------------------------------
@SETTINGS
@given(st.sampled_from(["power_mh", "entropy_cut"]).flatmap(cases))
def test_clamped_ratio_equals_the_plain_ratio_when_every_g_is_at_most_zero(case):
    alpha = case.kernel.alpha
    for logp0, logq in ((case.state.logp0, case.state.logq), (case.proposal.logp0, case.proposal.logq)):
        with np.errstate(invalid="ignore"):
            g = alpha * logp0 - logq
        if not np.all(np.isfinite(g)) or np.any(g > 1e-12):
            return  # noise or an injected value: the law is not compared here
    if not (np.all(np.isfinite(case.state.entropy)) and np.all(np.isfinite(case.proposal.entropy))):
        return
    plain = PowerMHKernel(alpha, case.kernel.cut_law)  # today's ratio
    clamped = case.kernel.log_accept_ratio(case.state, case.cut, case.proposal)
    expected = plain.log_accept_ratio(case.state, case.cut, case.proposal)
    if math.isnan(expected) or math.isnan(clamped):  # a cut of weight 0 in x and y: both reject
        assert math.isnan(expected) and math.isnan(clamped)
    elif math.isinf(expected) or math.isinf(clamped):
        assert clamped == expected
    else:
        assert clamped == pytest.approx(expected, abs=1e-9, rel=1e-9)


def test_consistent_logits_give_g_at_most_zero_up_to_rounding():
    """g = (alpha - 1/tau) log p0 + log Z_{1/tau} <= 0 for 1/alpha <= tau <= 1, over every token."""
    rng = np.random.default_rng(0)
    for alpha in (1.0, 2.0, 4.0, 8.0):
        for tau in (1.0 / alpha, 0.5 * (1.0 / alpha + 1.0), 1.0):
            z = 6.0 * rng.standard_normal((200, 16))
            logp0 = np.array([_log_softmax(row) for row in z])
            logq = np.array([_log_softmax(row / tau) for row in z])
            assert (alpha * logp0 - logq).max() <= 1e-12
            assert clamped_log_weights(alpha, logp0.ravel(), logq.ravel()).max() <= 0.0


# --- (5) the bound fires on peaked proposals ----------------------------------------------
def _caught_early(sampler: str, alpha: float, fixed_length: bool) -> tuple[int, int, int, int]:
    """(rejected steps, of them caught before the proposal ended, proposal tokens, tokens after
    the first certain rejection) over toy chains with LLM-like peaked distributions."""
    engine = ToyEngine(vocab_size=32, eos_token_id=None if fixed_length else 0, seed=3, logit_scale=4.0, eos_bias=-1.0)
    config = SamplerConfig(alpha=alpha, sampler=sampler, fixed_length=fixed_length)
    kernel, horizon = build_kernel(config), 24
    rejected = caught = tokens = skipped = 0
    for seed in range(12):
        request = ProposalRequest((1, 2), (), horizon, config.tau, seed, stop_at_eos=not fixed_length, want_entropy=True)
        state = ChainState((), np.zeros(0), np.zeros(0), np.zeros(0)).replace_suffix(0, engine.generate([request]).completions[0])
        for step in range(12):
            keys = step_keys(seed, step)
            cut = kernel.cut_law.draw(keys.cut_uniform, state)
            request = ProposalRequest((1, 2), state.tokens[:cut], horizon - cut, config.tau, keys.proposal_seed, not fixed_length, True)
            proposal = engine.generate([request]).completions[0]
            assert proposal.entropy is not None
            bound = kernel.rejection_bound(state, cut, keys.accept_uniform, horizon if fixed_length else None)
            assert bound is not None
            transition = kernel.transition(state, cut, [proposal], keys)
            running, stop = bound.start(), None
            for m in range(len(proposal.token_ids)):
                if running.push(proposal.logp0[m], proposal.logq[m], proposal.entropy[m]) and stop is None:
                    stop = m + 1
            assert stop is None or not transition.accepted
            tokens += len(proposal.token_ids)
            if not transition.accepted:
                rejected += 1
                if stop is not None and stop < len(proposal.token_ids):
                    caught, skipped = caught + 1, skipped + len(proposal.token_ids) - stop
            state = transition.state
    return rejected, caught, tokens, skipped


@pytest.mark.parametrize("sampler", ["power_mh", "entropy_cut"])
@pytest.mark.parametrize("fixed_length", [False, True])
def test_the_bound_catches_rejections_early_on_peaked_proposals(sampler, fixed_length):
    rejected, caught, tokens, skipped = _caught_early(sampler, 4.0, fixed_length)
    assert rejected >= 20  # the measurement has something to measure
    assert caught >= 0.2 * rejected, (rejected, caught)
    assert skipped >= 0.05 * tokens, (tokens, skipped)


# --- the config switch ---------------------------------------------------------------------
def test_the_switch_is_on_by_default_and_changes_no_sample():
    assert SamplerConfig().early_rejection is True
    engine = ToyEngine(vocab_size=8, eos_token_id=0, seed=1, logit_scale=4.0)
    for sampler in ("power_mh", "entropy_cut", "multi_try"):
        on = SamplerConfig(block_size=6, num_blocks=2, mh_steps=4, sampler=sampler, seed=5)
        off = on.model_copy(update={"early_rejection": False})
        assert sample(engine, (1, 2), on).token_ids == sample(engine, (1, 2), off).token_ids
