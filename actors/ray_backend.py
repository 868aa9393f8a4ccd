"""`validate --ray` and `eval --ray`: the backend of presto_ray/backend.py on the Ray layer.

Engine replicas and the batching coordinator come from `SamplingCluster`; chains run as
coroutines in the driver through `drive_chain` (the loop the Ray Data stage and Serve share), so a
kernel given to `sample` (validate's fault) needs no pickling; plain generations are one
`submit` to the coordinator, which batches and routes them like any chain's round.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

from actors.chain_driver import drive_chain, generate
from actors.cluster import SamplingCluster
from actors.engine_replica import ReplicaHandle
from presto_ray.backend import KernelFactory
from presto_ray.chain import Chain
from presto_ray.config import SamplerConfig
from presto_ray.engines.base import Completion, ProposalRequest
from presto_ray.engines.specs import build_tokenizer
from presto_ray.job import JobConfig
from presto_ray.results import SampleResult


class RayBackend:
    def __init__(self, job_config: JobConfig, *, address: str | None = None, replicas: Sequence[ReplicaHandle] | None = None) -> None:
        self.tokenizer = build_tokenizer(job_config.engine)
        self.eos_token_id = self.tokenizer.eos_token_id
        self.cluster = SamplingCluster(job_config.engine, job_config.ray, address=address, replicas=replicas)
        self._ids = itertools.count()

    def sample(
        self, prompts: Sequence[Sequence[int]], configs: Sequence[SamplerConfig], kernel_factory: KernelFactory | None = None
    ) -> list[SampleResult]:
        chains = [
            Chain(p, c, self.eos_token_id, kernel=kernel_factory(c) if kernel_factory else None)
            for p, c in zip(prompts, configs, strict=True)
        ]

        async def run() -> list[SampleResult]:
            return await asyncio.gather(
                *(
                    drive_chain(self.cluster.coordinators.for_prompt(chain.prompt), ("presto-ray", next(self._ids)), chain)
                    for chain in chains
                )
            )

        return list(asyncio.run(run()))

    def generate(self, requests: Sequence[ProposalRequest]) -> list[Completion]:
        if not requests:
            return []
        return asyncio.run(generate(self.cluster.coordinator, requests))

    def close(self) -> None:
        self.cluster.shutdown()
