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
    assert SamplerConfig(block_size=8, num_blocks=3).horizon == 24
    with pytest.raises(ValidationError):
        SamplerConfig(block_size=100_000, num_blocks=1000)
    with pytest.raises(ValidationError):
        config.alpha = 2.0  # frozen: a running chain's config cannot drift


def test_engine_kv_block_size_rename_is_named_in_the_error():
    from presto_ray.job import JobConfig

    with pytest.raises(ValidationError) as info:
        JobConfig.model_validate({"engine": {"kind": "vllm", "block_size": 32}})
    assert "kv_block_size" in str(info.value) and "sampler.block_size" in str(info.value)
    assert JobConfig.model_validate({"engine": {"kind": "vllm", "kv_block_size": 16}}).engine.kv_block_size == 16


def test_replica_gpus_default_to_what_the_engine_spans():
    from presto_ray.job import JobConfig

    gpu = {"kind": "vllm", "device": "gpu", "tensor_parallel_size": 2}
    assert JobConfig.model_validate({"engine": gpu}).engine.gpus_per_replica == 2
    assert JobConfig.model_validate({"engine": {"kind": "vllm"}}).engine.gpus_per_replica == 0  # vLLM on the CPU
    assert JobConfig.model_validate({"engine": {"kind": "toy"}}).engine.gpus_per_replica == 0
    with pytest.raises(ValidationError) as info:
        JobConfig.model_validate({"engine": gpu, "ray": {"replica_num_gpus": 1}})
    assert "replica_num_gpus" in str(info.value) and "tensor_parallel_size" in str(info.value)
    assert JobConfig.model_validate({"engine": gpu, "ray": {"replica_num_gpus": 4}}).ray.replica_num_gpus == 4
