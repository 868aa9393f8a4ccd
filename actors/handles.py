"""Typed actor handles: `@remote_method` on the methods other actors call, and `kill_actor`.

`remote_method` is Ray's `ray.method`, which is what types `handle.method.remote(...)`: with it, a
handle typed `ActorProxy[T]` (what `ray.remote(T).remote()` returns) gives `ObjectRef[R]` for a
method of `T` that returns `R` (or an awaitable of `R`), and mypy checks the arguments
(https://docs.ray.io/en/latest/ray-core/type-hint.html). `ActorHandle[T]` alone does not: its
`__getattr__` returns `Never`, so mypy takes every line after such a call as unreachable and
checks none of them.

`num_returns=1` is Ray's default for a method that is not a generator, so the actor behaves as
without the decorator; it is spelled out because the bare `@ray.method` fails under Ray Client,
whose `ray.method` takes keyword options only.
"""

from __future__ import annotations

from typing import Any, cast

import ray
from ray.actor import ActorHandle, ActorProxy

remote_method = ray.method(num_returns=1)


def kill_actor(actor: ActorProxy[Any]) -> None:
    """`ray.kill(actor, no_restart=True)`. `ActorProxy[T]` is `ActorHandle[T] | type[T]` for the
    type checker only (the `type[T]` half types the methods' calls); the object is the handle."""
    ray.kill(cast("ActorHandle[Any]", actor), no_restart=True)
