"""Chain actors: each runs many chains as coroutines, every round through the coordinator."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import ray
from ray.exceptions import RayActorError

from actors.metrics import ChainMetrics
from presto_ray.chain import Chain
from presto_ray.config import SamplerConfig
from presto_ray.results import SampleResult


@dataclass(frozen=True)
class ChainWork:
    """One (prompt, chain) pair: everything its sample depends on."""

    chain_id: tuple[str, int]  # (prompt id, chain index)
    prompt_token_ids: tuple[int, ...]
    config: SamplerConfig  # its seed is the chain's own


class ChainActor:
    """Drives `Chain` (plan, submit, advance) and nothing else.

    Its randomness is keyed inside the chain, so a chain re-run after this actor dies draws the
    same sample: the job driver simply submits the same `ChainWork` again.
    """

    def __init__(self, coordinator, eos_token_id: int | None) -> None:
        self.coordinator = coordinator
        self.eos_token_id = eos_token_id

    def ready(self) -> bool:
        return True

    async def run(self, work: ChainWork) -> SampleResult:
        chain = Chain(work.prompt_token_ids, work.config, self.eos_token_id)
        return await drive_chain(self.coordinator, work.chain_id, chain)


async def drive_chain(coordinator, chain_id, chain: Chain, on_round=None) -> SampleResult:
    """Run `chain` to the end through the coordinator: the loop every Ray-side driver shares.

    `on_round(chain)` (optional) is awaited after each round, e.g. to stream progress.
    """
    metrics = _chain_metrics()
    started = time.perf_counter()
    try:
        while not chain.done:
            completions = await coordinator.submit.remote(chain_id, chain.plan())
            metrics.record_round(chain.advance(completions).transitions)
            if on_round is not None:
                await on_round(chain)
    finally:
        try:
            await coordinator.chain_finished.remote(chain_id)
        except RayActorError:  # a restarting coordinator has forgotten the chain anyway
            pass
    return chain.result(time.perf_counter() - started)


@functools.cache
def _chain_metrics() -> ChainMetrics:
    """One set per process: Ray metrics are registered once and shared by every chain here."""
    return ChainMetrics()


def start_chain_actors(coordinator, eos_token_id: int | None, settings, chains_per_actor: int) -> list:
    remote = ray.remote(ChainActor)
    actors = [
        remote.options(
            num_cpus=settings.chain_actor_num_cpus,
            max_restarts=settings.chain_max_restarts,
            max_concurrency=max(1, chains_per_actor),
        ).remote(coordinator, eos_token_id)
        for _ in range(settings.chain_actors)
    ]
    ray.get([a.ready.remote() for a in actors])
    return actors
