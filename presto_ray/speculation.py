"""How many requests a streaming chain may keep running: a pure policy over the device's load.

Speculation is worth its tokens only while the device has room it would otherwise leave idle.
A device's free batch is the number of sequences a decode step can hold before it costs three
times a lone sequence's step (`2 * step_cost / step_cost_per_sequence`: unlimited on a GPU-like
device whose batch is free, about 30 sequences for vLLM on these two CPU cores from the
throughputs in ENGINE_NOTES.md), capped by the most sequences it runs at once. The active chains
share it; every chain keeps at least its needed request, so under heavy load streaming degrades to
the serial chain instead of slowing it.

Why three times: on the load benchmark's CPU-like device (step cost 1 + running / 16, 8 chains,
virtual time) sharing the batch at which the cost doubles gave 1.51x serial's throughput, at
which it triples 1.77x, at five times 1.69x (more speculation, more tokens, no more speed).
"""

from __future__ import annotations


def free_batch(step_cost: float, step_cost_per_sequence: float, max_running: int | None) -> float:
    """Sequences a step holds before it costs three lone steps, capped by `max_running` (inf: no limit)."""
    room = 2 * step_cost / step_cost_per_sequence if step_cost_per_sequence > 0 else float("inf")
    return min(room, max_running) if max_running is not None else room


def streaming_budget(prefetch_budget: int, active_chains: int, batch: float) -> int:
    """Requests one chain may keep running: its share of the free batch, between 1 and its budget."""
    if active_chains <= 0 or batch == float("inf"):
        return prefetch_budget
    return max(1, min(prefetch_budget, int(batch // active_chains)))
