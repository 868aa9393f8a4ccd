"""`drive_chain`: one chain, every round or stream through the coordinator. The loop every Ray-side
driver shares: the Ray Data stage's actors (actors/sampling_stage.py), the Serve ingress and
`validate --ray` / `eval --ray` (actors/ray_backend.py) each run many chains as its coroutines.
It holds no actor: it runs in the caller's process and talks to the coordinator actor."""

from __future__ import annotations

import functools
import time
import uuid
from typing import TYPE_CHECKING, Awaitable, Callable, Hashable, Sequence

from ray.exceptions import RayActorError

from actors.metrics import ChainMetrics
from actors.stream_protocol import ChainActions, ChainUpdate
from presto_ray.chain import Chain
from presto_ray.chain_stream import ChainStream, StreamRequestError
from presto_ray.collector import collecting_less
from presto_ray.engines.base import Completion, ProposalRequest
from presto_ray.results import SampleResult
from presto_ray.rounds import ChainRounds

if TYPE_CHECKING:
    from actors.coordinator import CoordinatorHandle

__all__ = ["StreamRequestError", "drive_chain", "generate"]  # StreamRequestError: what a refused request raises

OnRound = Callable[[Chain], Awaitable[None]]  # awaited after each round (streaming: each batch of events that made progress)


async def generate(coordinator: CoordinatorHandle, requests: Sequence[ProposalRequest]) -> list[Completion]:
    """Plain requests (no chain: greedy, temperature sampling, best-of-n candidates) as one submit
    of an anonymous chain's round, which the coordinator batches and routes like any other."""
    chain_id = ("presto-ray-generate", uuid.uuid4().hex)
    try:
        return list(await coordinator.submit.remote(chain_id, list(requests)))
    finally:
        try:
            await coordinator.chain_finished.remote(chain_id)
        except RayActorError:
            pass  # the coordinator died with the round: it forgot the chain with everything else


async def drive_chain(coordinator: CoordinatorHandle, chain_id: Hashable, chain: Chain, on_round: OnRound | None = None) -> SampleResult:
    """Run `chain` to the end through the coordinator, in rounds or streaming as its config says.

    `on_round(chain)` (optional) is awaited after each round (streaming: each batch of events that
    completed a transition), e.g. to stream progress.
    """
    metrics = _chain_metrics()
    started = time.perf_counter()
    try:
        if chain.config.schedule == "streaming":
            await _stream(coordinator, chain_id, ChainStream(chain), metrics, on_round)
        else:
            await _rounds(coordinator, chain_id, ChainRounds(chain), metrics, on_round)
    finally:
        try:
            await coordinator.chain_finished.remote(chain_id)
        except RayActorError:  # a restarting coordinator has forgotten the chain anyway
            pass
    return chain.result(time.perf_counter() - started)


async def _rounds(coordinator: CoordinatorHandle, chain_id: Hashable, rounds: ChainRounds, metrics: ChainMetrics, on_round: OnRound | None) -> None:
    prefetch_budget = rounds.chain.config.prefetch_budget
    while not rounds.done:
        planned = rounds.plan(await coordinator.round_budget.remote(chain_id, prefetch_budget))
        completions = await coordinator.submit.remote(chain_id, list(planned.requests))
        metrics.record_round(rounds.advance(planned, completions).transitions)
        if on_round is not None:
            await on_round(rounds.chain)


async def _stream(coordinator: CoordinatorHandle, chain_id: Hashable, stream: ChainStream, metrics: ChainMetrics, on_round: OnRound | None) -> None:
    """The streaming schedule through the coordinator (presto_ray/streaming.py is the in-process
    form; both only carry what `ChainStream.step` decides): send what the chain wants aborted,
    started and woken; hand it the events that land."""
    with collecting_less():  # the plan nodes a streaming chain keeps (presto_ray/collector.py)
        actions = stream.step(budget=await coordinator.stream_open.remote(chain_id, stream.chain.config.prefetch_budget))
        while not actions.done:  # done: chain_finished aborts what is still running
            update: ChainUpdate = await coordinator.stream_exchange.remote(
                chain_id, ChainActions(actions.aborts, actions.starts, actions.wakes, actions.bounds)
            )
            actions = stream.step(update.events, update.budget)
            if actions.transitions:  # progress, not every fork point
                metrics.record_round(actions.transitions)
                if on_round is not None:
                    await on_round(stream.chain)


@functools.cache
def _chain_metrics() -> ChainMetrics:
    """One set per process: Ray metrics are registered once and shared by every chain here."""
    return ChainMetrics()
