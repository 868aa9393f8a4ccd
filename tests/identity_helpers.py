"""Shared by the identity tests: hypothesis strategies for random sampler configs and toy engines,
and a chain run that records its edges."""

import numpy as np
from hypothesis import strategies as st

from presto_ray.chain import Chain
from presto_ray.driver import run_chain


def run_recorded(engine, prompt, config) -> Chain:
    """`config`'s chain driven to the end on `engine`, with every MH edge recorded."""
    chain = Chain(prompt, config, engine.eos_token_id, record_edges=True)
    run_chain(engine, chain)
    return chain


CONFIG_FIELDS = {
    "alpha": st.sampled_from([1.0, 2.0, 4.0]),
    "block_size": st.integers(1, 12),
    "num_blocks": st.integers(1, 3),
    "mh_steps": st.integers(0, 12),
    "prefetch_budget": st.integers(4, 24),
    "seed": st.integers(0, 2**40),
    "fixed_length": st.booleans(),
    "stop_at_eos": st.booleans(),
    "refit_every": st.sampled_from([1, 4, 32]),
    "min_expected_gain": st.sampled_from([0.0, 0.05, 0.3]),
    "speculation_gain": st.sampled_from([0.0, 3.2, 8.0]),
    "fork_wake_share": st.sampled_from([0.0, 0.25, 1.0]),
    "plan_min_reach": st.sampled_from([0.0, 0.003, 0.05]),
    "sampler": st.sampled_from(["power_mh", "entropy_cut", "multi_try"]),
    "num_tries": st.integers(2, 4),
    "early_rejection": st.booleans(),
}
configs = st.fixed_dictionaries(CONFIG_FIELDS)

engines = st.fixed_dictionaries(
    {
        "vocab_size": st.integers(2, 12),
        "eos_token_id": st.one_of(st.none(), st.just(0)),
        "seed": st.integers(0, 1000),
        "logit_scale": st.sampled_from([0.5, 1.0, 4.0]),
        "eos_bias": st.sampled_from([-2.0, 0.0, 1.0]),
    }
)


def assert_same_walk(chain, reference) -> None:
    """`chain` walked `reference`'s trajectory step for step: the same state, the same cuts and
    decisions, the same ratios; where either stopped a proposal by early rejection, its recorded
    ratio is an upper bound on the other's exact one, and both rejected."""
    assert chain.state.tokens == reference.state.tokens
    np.testing.assert_array_equal(chain.state.logp0, reference.state.logp0)
    assert len(chain.edges) == len(reference.edges)
    for edge, other in zip(chain.edges, reference.edges):
        assert (edge.step, edge.cut, edge.horizon, edge.accepted) == (other.step, other.cut, other.horizon, other.accepted)
        if edge.stopped_early == other.stopped_early:
            assert edge.log_ratio == other.log_ratio or edge.stopped_early, (edge, other)
        else:
            stopped, exact = (edge, other) if edge.stopped_early else (other, edge)
            assert not stopped.accepted and stopped.log_ratio >= exact.log_ratio, (edge, other)
