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


# --- ranges (issue 15 item 3): the same limits from Python, YAML and HTTP -----------------------
@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"alpha": float("inf")}, "alpha"),
        ({"alpha": float("nan")}, "alpha"),
        ({"alpha": 1e308}, "alpha"),
        ({"alpha": 1000.5}, "alpha"),
        ({"proposal_temperature": 1e-320}, "proposal_temperature"),
        ({"proposal_temperature": float("nan")}, "proposal_temperature"),
        ({"predictor_prior_strength": float("inf")}, "predictor_prior_strength"),
    ],
)
def test_non_finite_and_absurd_numbers_are_rejected(kwargs, field):
    with pytest.raises(ValidationError) as info:
        SamplerConfig(**kwargs)
    assert field in str(info.value)


def test_the_range_ends_are_accepted():
    from presto_ray.config import MAX_ALPHA, MIN_PROPOSAL_TEMPERATURE

    assert SamplerConfig(alpha=MAX_ALPHA).tau == pytest.approx(MIN_PROPOSAL_TEMPERATURE)
    assert SamplerConfig(alpha=1.0, proposal_temperature=MIN_PROPOSAL_TEMPERATURE).tau == MIN_PROPOSAL_TEMPERATURE


def test_yaml_infinity_is_rejected(tmp_path):
    from presto_ray.job import JobConfig

    path = tmp_path / "job.yaml"
    path.write_text("engine: {kind: toy}\nsampler: {alpha: .inf}\n")
    with pytest.raises(ValidationError) as info:
        JobConfig.from_yaml(path)
    assert "sampler.alpha" in str(info.value).replace("\n", ".")


def test_cross_field_errors_carry_their_field():
    from presto_ray.config import error_field, error_text

    with pytest.raises(ValidationError) as info:
        SamplerConfig(sampler="multi_try", num_tries=8, prefetch_budget=4)
    (error,) = info.value.errors()
    assert error_field(error) == "prefetch_budget" and error_text(error).startswith("prefetch_budget (4)")


# --- overflow-safe acceptance ratios ------------------------------------------------------------
def test_the_log_ratio_is_overflow_safe_and_unchanged_where_it_did_not_overflow():
    """alpha * log p0 overflowed to -inf on both sides (inf - inf = nan: a silent rejection); the
    ratio now follows the sums' difference, and every finite ratio keeps its exact value."""
    import math

    from presto_ray.kernels import PowerMHKernel

    better, worse = (-5.0, -1.0), (-10.0, -2.0)  # (log p0 sum, log q sum) of a suffix
    assert PowerMHKernel(1e300).log_weight_difference(better, worse) > 0
    assert PowerMHKernel(1e308).log_weight_difference(better, worse) == math.inf  # was nan: rejected
    assert PowerMHKernel(1e308).log_weight_difference(worse, better) == -math.inf
    impossible = (-math.inf, 0.0)
    assert PowerMHKernel(4.0).log_weight_difference(impossible, impossible) == -math.inf
    for alpha in (1.0, 4.0, 1000.0):
        kernel = PowerMHKernel(alpha)
        for forward, backward in ((better, worse), ((-3.25, -0.5), (-1.125, -7.0)), ((-0.1, -0.2), (-0.1, -0.2))):
            plain = kernel.log_weight(*forward) - kernel.log_weight(*backward)
            assert kernel.log_weight_difference(forward, backward) == plain  # bit for bit


def test_ingress_scaling_becomes_serve_options_and_bad_ranges_are_refused():
    from presto_ray.serve_config import ServeConfig

    assert ServeConfig(ingress_replicas=3).ingress_deployment_options() == {"max_ongoing_requests": 1024, "num_replicas": 3}
    scaled = ServeConfig(ingress_autoscaling={"min_replicas": 1, "max_replicas": 8, "target_ongoing_requests": 32})
    assert scaled.ingress_deployment_options() == {
        "max_ongoing_requests": 1024,
        "autoscaling_config": {"min_replicas": 1, "max_replicas": 8, "target_ongoing_requests": 32.0},
    }
    with pytest.raises(ValidationError, match="max_replicas"):
        ServeConfig(ingress_autoscaling={"min_replicas": 4, "max_replicas": 2})
    with pytest.raises(ValidationError, match="ingress_replicas"):
        ServeConfig(ingress_replicas=0)


def test_coordinator_shards_are_bounded():
    from presto_ray.ray_config import RayConfig

    assert RayConfig(coordinator_shards=4).coordinator_shards == 4
    with pytest.raises(ValidationError, match="coordinator_shards"):
        RayConfig(coordinator_shards=0)
