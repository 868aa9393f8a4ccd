"""An engine replica: one actor owning one engine (vLLM on a GPU, vLLM on the CPU, or the toy)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from presto_ray.engines import EngineOutput, EngineSpec, ProposalRequest, build_engine


class EngineReplica:
    """Runs batched calls on its engine. Async, so that a slow call never blocks `ready` probes.

    vLLM calls overlap (its own scheduler batches them); the toy serves one call at a time, in a
    worker thread, like a device that runs one batch at once.
    """

    def __init__(self, engine_spec: EngineSpec, replica_index: int) -> None:
        self.replica_index = replica_index
        self.engine = build_engine(engine_spec)

    def ready(self) -> dict:
        return {"replica": self.replica_index, "pid": os.getpid(), "eos_token_id": self.engine.eos_token_id}

    async def generate(self, requests: Sequence[ProposalRequest]) -> EngineOutput:
        return await self.engine.agenerate(requests)

    def shutdown(self) -> None:
        self.engine.shutdown()
