"""presto-ray: exact power sampling with PreSTO prefetching."""

from presto_ray.config import SamplerConfig
from presto_ray.driver import sample
from presto_ray.results import SampleResult, SampleStats

__all__ = ["SamplerConfig", "SampleResult", "SampleStats", "sample"]
__version__ = "0.1.0"
