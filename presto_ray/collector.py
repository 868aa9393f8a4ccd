"""The cyclic garbage collector while chains stream: both streaming drivers (presto_ray/streaming.py
in process, actors/chain_driver.py over Ray) run their loops inside `collecting_less()`.

Python's cyclic collector runs a young-generation pass every 700 net container allocations and a
full pass over every live object every 100 of those. A streaming chain keeps thousands of plan
nodes alive (presto_ray/plan_cache.py's PlanCache) and allocates more at every event, so with many
chains the full passes dominate: on the toy (16 chains, configs/toy.yaml's sampler, CPU time, load
7-13 on 2 cores, one run each) the run took 19.9 and 22.3 s with Python's defaults (22 full
passes) and 15.1 s with these thresholds (2). What a chain drops while it runs is freed by
reference counting (its planner's one cycle, with its rules, lives as long as the chain), so
collecting less often holds no more memory. Samples do not depend on it.
"""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Iterator

COLLECTION_THRESHOLDS = (50_000, 50, 100)

_lock = threading.Lock()
_holders = 0  # blocks inside collecting_less() now (the Ray driver runs many chains' loops at once)
_saved: tuple[int, ...] = ()


@contextmanager
def collecting_less() -> Iterator[None]:
    """The collector's thresholds raised to at least COLLECTION_THRESHOLDS while any such block
    runs (process-wide: a thread that runs meanwhile collects less often too); the thresholds the
    first block found are put back when the last one ends, also on failure. Blocks may nest and
    overlap (coroutines, threads) in any order."""
    global _holders, _saved
    with _lock:
        if _holders == 0:
            _saved = gc.get_threshold()
            gc.set_threshold(*(max(old, new) for old, new in zip(_saved, COLLECTION_THRESHOLDS)))
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                gc.set_threshold(*_saved)
