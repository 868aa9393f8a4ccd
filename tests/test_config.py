"""Bad configurations are rejected with messages that name the field."""

import pytest
from pydantic import ValidationError

from presto_ray import SamplerConfig


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"alpha": 0.5}, "alpha"),
        ({"prefetch_budget": 0}, "prefetch_budget"),
        ({"prefetch_budget": 10**9}, "prefetch_budget"),
        ({"traversal": "dfs"}, "traversal"),
        ({"block_size": 0}, "block_size"),
        ({"mh_steps": -1}, "mh_steps"),
        ({"proposal_temperature": 0.0}, "proposal_temperature"),
        ({"seed": -3}, "seed"),
        ({"alpha": "lots"}, "alpha"),
        ({"temperature": 1.0}, "temperature"),  # unknown fields are not silently ignored
    ],
)
def test_bad_values_are_rejected_naming_the_field(kwargs, field):
    with pytest.raises(ValidationError) as info:
        SamplerConfig(**kwargs)
    assert field in str(info.value)


def test_unknown_traversal_lists_the_choices():
    with pytest.raises(ValidationError) as info:
        SamplerConfig(traversal="dfs")
    assert "'serial', 'bfs' or 'predictive'" in str(info.value)


def test_defaults_and_derived_values():
    config = SamplerConfig()
    assert config.alpha == 4.0 and config.tau == 0.25
    assert SamplerConfig(alpha=2.0, proposal_temperature=0.7).tau == 0.7
    assert SamplerConfig(sampler="multi_try", num_tries=3, prefetch_budget=6).requests_per_step == 3
    assert SamplerConfig(block_size=8, num_blocks=3).max_new_tokens == 24
    with pytest.raises(ValidationError):
        SamplerConfig(block_size=100_000, num_blocks=1000)
    with pytest.raises(ValidationError):
        config.alpha = 2.0  # frozen: a running chain's config cannot drift
