"""An engine replica: one actor owning one engine (vLLM on a GPU, vLLM on the CPU, or the toy)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

import ray

from presto_ray.engines.base import EngineOutput, ProposalRequest


class EngineReplica:
    """Runs batched calls on its engine. Async, so that a slow call never blocks `ready` probes.

    vLLM calls overlap (its own scheduler batches them); engines without `agenerate` (the toy)
    run one call at a time in a worker thread, like a device that serves one batch at once.
    """

    def __init__(self, engine_spec, replica_index: int) -> None:
        from presto_ray.job import build_engine

        self.replica_index = replica_index
        self.engine = build_engine(engine_spec)
        self._lock = asyncio.Lock()

    def ready(self) -> dict:
        return {"replica": self.replica_index, "pid": os.getpid(), "eos_token_id": self.engine.eos_token_id}

    async def generate(self, requests: Sequence[ProposalRequest]) -> EngineOutput:
        if hasattr(self.engine, "agenerate"):
            return await self.engine.agenerate(requests)
        async with self._lock:
            return await asyncio.to_thread(self.engine.generate, requests)

    def shutdown(self) -> None:
        if hasattr(self.engine, "shutdown"):
            self.engine.shutdown()


def start_replicas(engine_spec, settings) -> list:
    """Create `settings.num_replicas` replica actors, in one placement group when configured."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    remote = ray.remote(EngineReplica)
    options = dict(
        num_cpus=settings.replica_num_cpus,
        num_gpus=settings.replica_num_gpus,
        max_restarts=settings.replica_max_restarts,
        max_concurrency=max(8, 2 * settings.max_inflight_calls),
    )
    group = None
    if settings.placement_strategy:
        bundle = {"CPU": settings.replica_num_cpus, "GPU": settings.replica_num_gpus}
        bundle = {k: v for k, v in bundle.items() if v > 0} or {"CPU": 0.001}
        group = ray.util.placement_group([bundle] * settings.num_replicas, strategy=settings.placement_strategy)
        ray.get(group.ready())
    replicas = []
    for i in range(settings.num_replicas):
        opts = dict(options)
        if group is not None:
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)
            if not settings.replica_num_cpus and not settings.replica_num_gpus:
                opts["num_cpus"] = 0.001
        replicas.append(remote.options(**opts).remote(engine_spec, i))
    ray.get([r.ready.remote() for r in replicas])
    return replicas
