"""Which replica a request goes to: a pure policy, shared by batched calls (the coordinator's
queues) and streams (the stream router), testable without Ray.

A request prefers the first replica of its prefix ranking (rendezvous order of its prompt's first
tokens: prefix-cache affinity), among the replicas that are healthy and not retiring, avoiding the
one that just failed it when another will do. It leaves its preferred replica for the least loaded
candidate when the preferred one holds more than `slack` more work. With nothing available it falls
back to any healthy replica, then to its preferred one (it waits there until a replica is back).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence


def prefix_key(prompt_token_ids: Sequence[int], affinity_tokens: int) -> int:
    """The affinity key of a prompt: a hash of its first `affinity_tokens` tokens."""
    return zlib.crc32(",".join(map(str, prompt_token_ids[:affinity_tokens])).encode())


def rendezvous_order(key: int, n: int, salt: str = "") -> list[int]:
    """0..n-1 by rendezvous weight for `key`: adding or removing a target moves only its keys
    (replicas by a prompt's key here; coordinator shards in actors/coordinator_shards.py)."""
    return sorted(range(n), key=lambda i: zlib.crc32(f"{key}:{salt}{i}".encode()), reverse=True)


def choose_replica(
    ranking: Sequence[int],
    load: Callable[[int], int],
    *,
    available: Callable[[int], bool],
    healthy: Callable[[int], bool],
    slack: int,
    avoid: int | None = None,
) -> int:
    candidates = (
        [i for i in ranking if available(i) and i != avoid]
        or [i for i in ranking if available(i)]
        or [i for i in ranking if healthy(i)]
        or list(ranking)
    )
    target, idlest = candidates[0], min(candidates, key=load)
    return idlest if load(target) > load(idlest) + slack else target
