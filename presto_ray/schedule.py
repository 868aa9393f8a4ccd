"""The chain's event schedule: per block, one extension then K MH steps.

Events are numbered globally; MH steps also carry their global step index j, which keys their
randomness (docs/algorithm.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from presto_ray.config import SamplerConfig


@dataclass(frozen=True)
class Event:
    index: int
    block: int
    is_extension: bool
    step: int  # global MH step index j; -1 for an extension
    horizon: int  # T = (block + 1) * B
    ends_block: bool


class Schedule:
    def __init__(self, config: SamplerConfig) -> None:
        self._per_block = config.mh_steps + 1
        self._block_size = config.block_size
        self._steps = config.mh_steps
        self.num_events = config.num_blocks * self._per_block
        self._events: dict[int, Event] = {}  # a planner asks for each event at every tree

    def event(self, index: int) -> Event:
        event = self._events.get(index)
        if event is None:
            event = self._events[index] = self._make_event(index)
        return event

    def _make_event(self, index: int) -> Event:
        block, offset = divmod(index, self._per_block)
        return Event(
            index=index,
            block=block,
            is_extension=offset == 0,
            step=block * self._steps + offset - 1 if offset else -1,
            horizon=(block + 1) * self._block_size,
            ends_block=offset == self._per_block - 1,
        )
