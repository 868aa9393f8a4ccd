"""A client that leaves before its answer or in the middle of its stream: not an error.

The ingress logs one line (no traceback, no error id), stops the request's chains, and counts it
once in the sampling pool (so /v1/stats' client_disconnects sums every ingress replica's). Serve
cancels such a request and Ray cancels every call the request made with it, a chain's
`chain_finished` included if it was in flight, so the coordinator would never hear that the chain
ended; the ingress therefore says `chain_finished` again for each of the request's chains, once
their tasks are over, from outside the request's Ray context (the coordinator takes a second word
for a chain as nothing).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Hashable, Sequence

from ray.exceptions import TaskCancelledError
from ray.serve.handle import DeploymentHandle
from starlette.requests import ClientDisconnect

from actors.background_tasks import outside_the_call
from actors.coordinator import CoordinatorHandle
from presto_ray.openai import client_disconnected

log = logging.getLogger("presto_ray.serve")

# after a client left: how long the ingress waits for its chains' tasks to end before saying
# chain_finished for them again (they end at their next await; this bounds a stuck one)
DISCONNECT_SETTLE_S = 10.0


def client_left(error: BaseException | None = None) -> bool:
    """Whether the running task is being cancelled (its client left), or `error` is Ray's word
    for the same: Serve cancels a request whose client went away and Ray cancels every call the
    request made, so an awaited coordinator call raises TaskCancelledError, maybe before the
    task's own cancellation arrives (nothing else cancels those calls), and a body being read
    ends in ClientDisconnect."""
    task = asyncio.current_task()
    return isinstance(error, TaskCancelledError | ClientDisconnect) or (task is not None and task.cancelling() > 0)


def outside_the_request() -> contextvars.Context:
    """A copy of this context without Ray's record of the request being served (the context
    variable Ray's recursive cancellation follows). Calls made in it outlive the request's
    cancellation: a chain's `chain_finished` that was in flight when its client left is
    cancelled with the request, so the coordinator never heard that the chain ended and
    expired it after chain_idle_timeout_s; the ingress says it again from here. (The
    coordinator runs its background work the same way: actors/background_tasks.py.)"""
    return outside_the_call()


class DisconnectReports:
    """One ingress replica's word on clients that left: `pool` is the sampling pool's handle (it
    counts them), the tasks on their way there are held until they are done."""

    def __init__(self, pool: DeploymentHandle) -> None:
        self.pool = pool
        self._reports: set[asyncio.Task[None]] = set()

    def report(
        self, request_id: str | None, where: str, coordinator: CoordinatorHandle | None = None,
        chain_ids: Sequence[Hashable] = (), chains: Sequence[asyncio.Task[object]] = (),
    ) -> None:  # fmt: skip
        """A client left: one log line, counted in the pool, and, once its chains' tasks are
        over, `chain_finished` again for each of its chains (`coordinator`), outside the request,
        where Ray's cancellation of the request cannot reach it."""
        client_disconnected(request_id, where)
        after = self._after(coordinator, chain_ids, chains)
        task = asyncio.get_running_loop().create_task(after, context=outside_the_request())
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    async def _after(self, coordinator: CoordinatorHandle | None, chain_ids: Sequence[Hashable], chains: Sequence[asyncio.Task[object]]) -> None:
        if chains:  # each was cancelled: its own chain_finished goes out first (maybe to be cancelled)
            await asyncio.wait(chains, timeout=DISCONNECT_SETTLE_S)
        if coordinator is not None:
            try:  # bounded: a stuck coordinator must not keep the disconnect uncounted
                await asyncio.wait_for(asyncio.gather(*(coordinator.chain_finished.remote(cid) for cid in chain_ids)), DISCONNECT_SETTLE_S)
            except Exception as e:  # a restarting coordinator has forgotten the chains anyway
                log.info("after a client left: chain_finished for its chains did not complete (%s)", type(e).__name__)
        try:
            await self.pool.count_disconnect.remote()
        except Exception as e:  # the pool is restarting: the count is lost with it, nothing else
            log.warning("a client's disconnect went uncounted: the sampling pool's count failed (%s: %s)", type(e).__name__, e)
