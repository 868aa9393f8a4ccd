"""Coordinator shards: when one coordinator actor cannot keep up, `ray.coordinator_shards` start
several, each with its share of the engine replicas. A prompt's chains all go to one shard, chosen by
rendezvous hashing of the prompt's first `affinity_tokens` tokens (the key the coordinator routes
replicas by), so deduplication and prefix-cache affinity work within a shard exactly as in one coordinator.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterable, Sequence
from typing import TYPE_CHECKING

from actors.coordinator_stats import CoordinatorSnapshot
from actors.replica_choice import prefix_key, rendezvous_order

if TYPE_CHECKING:
    from actors.coordinator import CoordinatorHandle

__all__ = ["CoordinatorShards", "prefix_key", "rendezvous_order", "shard_replicas"]

# how long a snapshot that tolerates lost shards waits for each by default (a live one answers in ms)
LOST_OK_TIMEOUT_S = 10.0


def shard_replicas(num_replicas: int, num_shards: int) -> list[list[int]]:
    """The replica indices each shard drives: a partition when there are enough replicas; with fewer
    replicas than shards every shard uses all of them (replicas file events per coordinator)."""
    if num_replicas < num_shards:
        return [list(range(num_replicas)) for _ in range(num_shards)]
    return [list(range(s, num_replicas, num_shards)) for s in range(num_shards)]


class CoordinatorShards:
    """The coordinator actor handles of one cluster (picklable: stage actors and Serve replicas hold it)."""

    def __init__(self, handles: Sequence[CoordinatorHandle], affinity_tokens: int) -> None:
        if not handles:
            raise ValueError("at least one coordinator is needed")
        self.handles = list(handles)
        self.affinity_tokens = affinity_tokens

    def __len__(self) -> int:
        return len(self.handles)

    def index_for(self, prompt_token_ids: Sequence[int]) -> int:
        if len(self.handles) == 1:
            return 0
        return rendezvous_order(prefix_key(prompt_token_ids, self.affinity_tokens), len(self.handles), "shard")[0]

    def for_prompt(self, prompt_token_ids: Sequence[int]) -> CoordinatorHandle:
        """The coordinator that serves every chain of this prompt."""
        return self.handles[self.index_for(prompt_token_ids)]

    async def register_chains(self, chains: Iterable[tuple[Sequence[int], Hashable]]) -> None:
        """(prompt token ids, chain id) pairs about to start, each told to its prompt's shard: the
        first dispatch then waits for all their plans, so a batch's first round is one call."""
        by_shard: dict[int, list[Hashable]] = {}
        for prompt_token_ids, chain_id in chains:
            by_shard.setdefault(self.index_for(prompt_token_ids), []).append(chain_id)
        await asyncio.gather(*(self.handles[i].register_chains.remote(ids) for i, ids in by_shard.items()))

    async def snapshot(self) -> CoordinatorSnapshot:
        """Every shard's figures, combined (per-replica lists indexed by the cluster's replica)."""
        return CoordinatorSnapshot.combine([await h.snapshot.remote() for h in self.handles])

    def snapshot_blocking(self, timeout: float | None = None, lost_ok: bool = False) -> CoordinatorSnapshot:
        """As `snapshot`; with `lost_ok` a shard that does not answer within `timeout` (default
        LOST_OK_TIMEOUT_S; its node lost, Ray restarting it) counts as
        `CoordinatorSnapshot.unanswered()` instead of raising: a job whose rows are all written
        does not fail over its figures."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        refs = [h.snapshot.remote() for h in self.handles]
        if not lost_ok:
            return CoordinatorSnapshot.combine(ray.get(refs, timeout=timeout))
        parts = []
        for ref in refs:
            try:
                parts.append(ray.get(ref, timeout=LOST_OK_TIMEOUT_S if timeout is None else timeout))
            except (RayActorError, GetTimeoutError):
                parts.append(CoordinatorSnapshot.unanswered())
        return CoordinatorSnapshot.combine(parts)
