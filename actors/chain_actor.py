"""`drive_chain`: one chain, every round or stream through the coordinator. The loop every Ray-side
driver shares: the Ray Data stage's actors (actors/sampling_stage.py), the Serve ingress and
`validate --ray` / `eval --ray` (actors/ray_backend.py) each run many chains as its coroutines."""

from __future__ import annotations

import functools
import time

from ray.exceptions import RayActorError

from actors.metrics import ChainMetrics
from actors.stream_protocol import ChainActions
from presto_ray.chain import Chain
from presto_ray.results import SampleResult


async def drive_chain(coordinator, chain_id, chain: Chain, on_round=None) -> SampleResult:
    """Run `chain` to the end through the coordinator: the loop every Ray-side driver shares, in
    rounds or streaming as the chain's config says.

    `on_round(chain)` (optional) is awaited after each round (streaming: each batch of events that
    completed a transition), e.g. to stream progress.
    """
    metrics = _chain_metrics()
    started = time.perf_counter()
    try:
        if chain.config.schedule == "streaming":
            await _stream(coordinator, chain_id, chain, metrics, on_round)
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


class StreamRequestError(RuntimeError):
    """An engine refused or lost one of a streaming chain's requests."""


async def _stream(coordinator, chain_id, chain: Chain, metrics: ChainMetrics, on_round) -> None:
    """The streaming schedule through the coordinator (presto_ray/streaming.py is the in-process
    form): send what the chain wants started, aborted and woken; walk what lands."""
    budget = await coordinator.stream_open.remote(chain_id, chain.config.prefetch_budget)
    running: set = set()  # the chain's requests the coordinator runs for it
    woken: set = set()
    while True:
        aborted = chain.useless_requests()
        running.difference_update(aborted)
        if chain.done:
            return  # chain_finished aborts what is still running
        starts = chain.start_requests(budget)
        running.update(start.key for start in starts)
        wakes = [point for point in chain.fork_points().items() if point not in woken]
        woken.update(wakes)
        actions = ChainActions(tuple(aborted), tuple(starts), tuple(wakes))
        update = await coordinator.stream_exchange.remote(chain_id, actions)
        budget, transitions = update.budget, 0
        for event in update.events:
            if event.key not in running:
                continue  # dropped by the chain after the event left its replica
            if event.error is not None:
                raise StreamRequestError(event.error)
            if event.completion is not None:
                running.discard(event.key)
                transitions += chain.complete(event.key, event.completion).transitions
            else:
                chain.observe_progress(event.key, event.partial)
        if transitions:  # progress, not every fork point
            metrics.record_round(transitions)
            if on_round is not None:
                await on_round(chain)


@functools.cache
def _chain_metrics() -> ChainMetrics:
    """One set per process: Ray metrics are registered once and shared by every chain here."""
    return ChainMetrics()
