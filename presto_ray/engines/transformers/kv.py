"""Key/value storage: the running sequences' slots, and a prefix cache keyed by token ids.

`SlotKV` holds, per layer, keys and values of shape (slots, kv_heads, capacity, head_dim): each
running sequence owns one slot, position p of its sequence at index p (no padding before it), so a
sequence's keys are always the view [slot, :, :length] whatever the other slots hold. A slot that
frees is taken by the next request (continuous batching); capacity and slots grow on demand.

`PrefixCache` keeps finished (and aborted) sequences' KV, keyed by their token ids: a new request
copies the KV of the longest cached prefix of its context into its slot and prefills only the
rest. Exact reuse: a position's keys and values are a function of the tokens up to it, and the
cache is keyed by all of them (a rolling hash per prefix length, every hit checked token by token).
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import torch

_HASH_MULT = 1_000_003
_HASH_MOD = (1 << 61) - 1
_CAPACITY_STEP = 64  # positions: capacity grows in multiples of this (and at least doubles)


@dataclass(frozen=True)
class KVShape:
    layers: int
    kv_heads: int
    head_dim: int


class SlotKV:
    """Per-layer keys and values of the running sequences, one slot each (see the module doc)."""

    def __init__(self, shape: KVShape, *, dtype: torch.dtype, device: torch.device, max_slots: int) -> None:
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self.max_slots = max_slots
        self.slots = 0
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def ensure(self, slots: int, capacity: int) -> None:
        """Room for `slots` slots of `capacity` positions (contents kept; both at least double when
        they grow, slots up to max_slots)."""
        if slots <= self.slots and capacity <= self.capacity:
            return
        new_slots = self.slots if slots <= self.slots else min(self.max_slots, max(slots, 2 * self.slots))
        new_capacity = self.capacity
        if capacity > self.capacity:
            new_capacity = -(-max(capacity, 2 * self.capacity) // _CAPACITY_STEP) * _CAPACITY_STEP
        s = self.shape
        size = (new_slots, s.kv_heads, new_capacity, s.head_dim)
        with torch.no_grad():
            keys = [torch.zeros(size, dtype=self.dtype, device=self.device) for _ in range(s.layers)]
            values = [torch.zeros(size, dtype=self.dtype, device=self.device) for _ in range(s.layers)]
            if self.slots:
                for layer in range(s.layers):
                    keys[layer][: self.slots, :, : self.capacity] = self.keys[layer]
                    values[layer][: self.slots, :, : self.capacity] = self.values[layer]
        self.keys, self.values = keys, values
        self.slots, self.capacity = new_slots, new_capacity

    def write(
        self, layer: int, slots: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
    ) -> None:
        """Keys and values (tokens, kv_heads, head_dim) of tokens at (slot, position) pairs."""
        expected = (self.shape.kv_heads, self.shape.head_dim)
        if tuple(keys.shape[1:]) != expected:
            raise ValueError(f"layer {layer} has keys of shape {tuple(keys.shape[1:])}, the cache holds {expected}")
        self.keys[layer][slots, :, positions] = keys.to(self.dtype)
        self.values[layer][slots, :, positions] = values.to(self.dtype)

    def view(self, layer: int, slot: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One sequence's first `length` keys and values, (1, kv_heads, length, head_dim) views."""
        return self.keys[layer][slot : slot + 1, :, :length], self.values[layer][slot : slot + 1, :, :length]

    def copy_out(self, slot: int, length: int) -> torch.Tensor:
        """A copy of one slot's first `length` positions, (layers, 2, kv_heads, length, head_dim)."""
        with torch.no_grad():
            return torch.stack(
                [torch.stack([k[slot, :, :length], v[slot, :, :length]]) for k, v in zip(self.keys, self.values)]
            ).clone()

    def copy_in(self, slot: int, kv: torch.Tensor, length: int) -> None:
        """Fill a slot's first `length` positions from `copy_out`'s layout."""
        with torch.no_grad():
            for layer, (k, v) in enumerate(zip(self.keys, self.values)):
                k[slot, :, :length] = kv[layer, 0, :, :length]
                v[slot, :, :length] = kv[layer, 1, :, :length]

    def copy_slot(self, source: int, target: int, length: int) -> None:
        """Copy the first `length` positions of one slot into another (a fork of a running sequence)."""
        with torch.no_grad():
            for k, v in zip(self.keys, self.values):
                k[target, :, :length] = k[source, :, :length]
                v[target, :, :length] = v[source, :, :length]


def prefix_hashes(tokens: Sequence[int], limit: int) -> list[int]:
    """Rolling hashes of tokens[:1], tokens[:2], ..., tokens[:limit]."""
    hashes, h = [], 0
    for token in itertools.islice(tokens, limit):
        h = (h * _HASH_MULT + int(token) + 1) % _HASH_MOD
        hashes.append(h)
    return hashes


def common_prefix_length(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """How many leading tokens a and b share, at most `limit`."""
    n = min(len(a), len(b), limit)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    kv: torch.Tensor  # (layers, 2, kv_heads, len(tokens), head_dim)
    hashes: list[int]


class PrefixCache:
    """KV of earlier sequences by token ids, least recently used first out, at most
    `capacity_tokens` positions in all (0: off). Thread-safe: the batch path and streaming forms
    of one engine share it."""

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self._lock = threading.Lock()
        self.tokens = 0
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._index: dict[int, int] = {}  # prefix hash -> id of the newest entry holding that prefix
        self._ids = itertools.count()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, tokens: Sequence[int], limit: int) -> tuple[torch.Tensor | None, int]:
        """The KV of the longest cached prefix of tokens[:limit] and its length ((None, 0): none)."""
        if limit <= 0:
            return None, 0
        hashes = prefix_hashes(tokens, limit)
        with self._lock:
            return self._lookup(tokens, hashes)

    def _lookup(self, tokens: Sequence[int], hashes: list[int]) -> tuple[torch.Tensor | None, int]:
        for length in range(len(hashes), 0, -1):
            entry_id = self._index.get(hashes[length - 1])
            if entry_id is None:
                continue
            entry = self._entries[entry_id]
            if entry.tokens[:length] == tuple(tokens[:length]):
                self._entries.move_to_end(entry_id)
                return entry.kv, length
        return None, 0

    def insert(self, tokens: Sequence[int], kv: torch.Tensor) -> None:
        """Keep `kv` (copy_out's layout, one position per token) for the prefixes of `tokens`; an
        entry that is a prefix of it is dropped (this one holds it all)."""
        tokens = tuple(tokens)
        if not tokens or len(tokens) > self.capacity_tokens:
            return
        hashes = prefix_hashes(tokens, len(tokens))
        with self._lock:
            self._insert(tokens, kv, hashes)

    def _insert(self, tokens: tuple[int, ...], kv: torch.Tensor, hashes: list[int]) -> None:
        _, held = self._lookup(tokens, hashes)
        if held == len(tokens):
            return  # already held in full (now the most recent)
        entry_id = next(self._ids)
        replaced = {self._index[h] for h in hashes if h in self._index}
        self._entries[entry_id] = _Entry(tokens, kv, hashes)
        self.tokens += len(tokens)
        for h in hashes:
            self._index[h] = entry_id
        for old in replaced:
            entry = self._entries.get(old)
            if entry is not None and tokens[: len(entry.tokens)] == entry.tokens:
                self._remove(old)
        while self.tokens > self.capacity_tokens:
            self._remove(next(iter(self._entries)))

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._index.clear()
            self.tokens = 0

    def _remove(self, entry_id: int) -> None:
        entry = self._entries.pop(entry_id)
        self.tokens -= len(entry.tokens)
        for h in entry.hashes:
            if self._index.get(h) == entry_id:
                del self._index[h]
