"""Tasks an actor starts and does not await, kept until they end (asyncio holds only weak
references to running tasks, so a dropped one may be collected mid-flight) and cancelled together.

They run outside the actor call that started them: Ray cancels a cancelled call's calls with it
(recursive cancellation follows the context variable that names the call being served, which a
task copies when it is created), and the work an actor starts in the background serves every
caller, not the one that happened to start it. A coordinator's engine call, stream start, abort or
replica poller started while one chain's call was in flight was cancelled when that chain's client
left: its awaited call raised TaskCancelledError ("Task exception was never retrieved" in the
coordinator's log for the fire-and-forget ones) and a call shared with other chains failed them.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import Any, TypeVar

import ray

T = TypeVar("T")


def outside_the_call() -> contextvars.Context:
    """A copy of this context without Ray's record of the actor call (or Serve request) being
    served, the context variable Ray's recursive cancellation follows: calls made in it are not
    cancelled when that call is."""
    context = contextvars.copy_context()
    current_task_id = getattr(getattr(ray, "_raylet", None), "async_task_id", None)
    if current_task_id is not None:
        context.run(current_task_id.set, None)
    return context


class BackgroundTasks:
    """A set of running tasks: each leaves the set when it is done; `cancel_all` stops the rest."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()  # of any result: nobody reads them from here

    def spawn(self, coroutine: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run `coroutine` as a task of its own, outside the actor call that spawns it."""
        task = asyncio.get_running_loop().create_task(coroutine, context=outside_the_call())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def __len__(self) -> int:
        return len(self._tasks)

    def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
