"""Where `presto-ray validate` and `presto-ray eval` run their work: power-sampling chains and plain
generations (greedy, temperature sampling) through one small interface.

`LocalBackend` drives an engine in process (`sample_many`, `engine.generate`);
`actors.ray_backend.RayBackend` runs the same work through the Ray coordinator (`--ray`). Neither
adds an engine API: plain generations are ordinary `ProposalRequest`s.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

from presto_ray.config import SamplerConfig
from presto_ray.driver import sample_many
from presto_ray.engines.base import Completion, Engine, ProposalRequest, Tokenizer
from presto_ray.kernels import PowerMHKernel
from presto_ray.results import SampleResult

KernelFactory = Callable[[SamplerConfig], PowerMHKernel]


class Backend(Protocol):
    tokenizer: Tokenizer

    def sample(
        self, prompts: Sequence[Sequence[int]], configs: Sequence[SamplerConfig], kernel_factory: KernelFactory | None = None
    ) -> list[SampleResult]:
        """One chain per (prompt, config), results in input order."""
        ...

    def generate(self, requests: Sequence[ProposalRequest]) -> list[Completion]:
        """Completions of plain requests, in input order."""
        ...

    def close(self) -> None: ...


class LocalBackend:
    """The in-process driver on one engine (which the backend shuts down at close)."""

    def __init__(self, engine: Engine, max_active_chains: int | None = None) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.max_active_chains = max_active_chains

    def sample(
        self, prompts: Sequence[Sequence[int]], configs: Sequence[SamplerConfig], kernel_factory: KernelFactory | None = None
    ) -> list[SampleResult]:
        results, _ = sample_many(
            self.engine, prompts, configs, max_active_chains=self.max_active_chains, kernel_factory=kernel_factory
        )
        return results

    def generate(self, requests: Sequence[ProposalRequest]) -> list[Completion]:
        return self.engine.generate(list(requests)).completions if requests else []

    def close(self) -> None:
        self.engine.shutdown()
