"""Tasks an actor starts and does not await, kept until they end (asyncio holds only weak
references to running tasks, so a dropped one may be collected mid-flight) and cancelled together."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundTasks:
    """A set of running tasks: each leaves the set when it is done; `cancel_all` stops the rest."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()  # of any result: nobody reads them from here

    def spawn(self, coroutine: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def __len__(self) -> int:
        return len(self._tasks)

    def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
