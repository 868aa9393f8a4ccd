"""How many requests a chain may have at once (running when streaming, in a round otherwise): a
pure policy over the device's load.

Speculation is worth its tokens only while the device has room it would otherwise leave idle.
A device's free batch is the number of sequences a decode step can hold before it costs three
times a lone sequence's step (`2 * step_cost / step_cost_per_sequence`: unlimited on a GPU-like
device whose batch is free, about 30 sequences for vLLM on these two CPU cores from its measured
throughputs), capped by the most sequences it runs at once. The active chains
share it; every chain keeps at least its needed request, so under heavy load streaming and rounds
degrade to the serial chain instead of slowing it (rounds at a full budget on vLLM at 64 chains ran
at 0.73x serial chains' speed: bench/results/local_load.json).

Why three times: on the load benchmark's CPU-like device (step cost 1 + running / 16, 8 chains,
virtual time) sharing the batch at which the cost doubles gave 1.51x serial's throughput, at
which it triples 1.77x, at five times 1.69x (more speculation, more tokens, no more speed).
"""

from __future__ import annotations

# Where the threshold below stops growing as the budget falls: a small budget still speculates on
# requests more likely than not to be used.
MAX_SPECULATION_THRESHOLD = 0.5


def free_batch(step_cost: float, step_cost_per_sequence: float, max_running: int | None) -> float:
    """Sequences a step holds before it costs three lone steps, capped by `max_running` (inf: no limit)."""
    room = 2 * step_cost / step_cost_per_sequence if step_cost_per_sequence > 0 else float("inf")
    return min(room, max_running) if max_running is not None else room


def budget_by_load(prefetch_budget: int, active_chains: int, batch: float) -> int:
    """Requests one chain may have at once: its share of the free batch, between 1 and its budget."""
    if active_chains <= 0 or batch == float("inf"):
        return prefetch_budget
    return max(1, min(prefetch_budget, int(batch // active_chains)))


def speculation_threshold(prefetch_budget: int, speculation_gain: float) -> float:
    """Expected completed transitions a speculative request must add before a streaming chain starts
    it (predictive selection): `speculation_gain / prefetch_budget`, at most MAX_SPECULATION_THRESHOLD;
    0 when `speculation_gain` is 0 (spend the whole budget).

    Why: streaming refills its budget the moment a request ends, so at the same budget it keeps
    more unlikely requests running than rounds (which fill it once per round) and aborts many of
    them part-way: at threshold 0 it spent 1.09-1.37x rounds' tokens on the virtual-clock bench
    (T = 96, K 10 / 24 / 100, budgets 8 and 20, fixed length and EOS). The threshold that keeps it
    within rounds' tokens falls as the budget grows, because rounds at a larger budget spend more
    tokens themselves; one constant for all budgets is too weak at 8 or too strong at 20 (0.3 at
    budget 20 was slower than rounds at K = 100 and gave 3.6x over serial at K = 24). 3.2 / budget
    (0.4 at 8, 0.16 at 20) spent no more tokens than rounds and ran faster than rounds in all
    twelve rows; 2.4 / budget spent more than rounds at K = 10, budget 20. Those runs (2026-11-29
    and -30) used the planner of that time. With the current one (it plans past a step waiting
    for a fork point, and conditions the accept branch on the step's keyed uniform;
    bench/results/virtual_clock.json, 2026-12-01) streaming at 3.2 / budget is faster than rounds
    in all 24 rows, early rejection off and on (1.20-1.77x rounds' speed), but spends more tokens
    than rounds in five, all at budget 20 (tokens vs serial's, streaming against rounds): off,
    EOS at K = 10 (1.442 against 1.440) and K = 100 (1.39 against 1.36); on, K = 10 at fixed
    length (1.33 against 1.27) and with EOS (1.34 against 1.27), and EOS at K = 100 (0.97
    against 0.88). Against the planner of 2026-12-05 (fork_wake_share, plan_min_reach) the same
    five rows spend more; 4.8 spends no more than rounds in any row at 0.94x 3.2's speed
    (bench/results/speculation_gain_refit.json, docs/streaming.md's "Not done yet"): 3.2 stays.
    The cap keeps small budgets speculating: at budget 4 (K = 24) 0.5 gave 2.43x over serial
    with 1.07x serial's tokens, rounds 2.04x with 1.08x. The budget is the configured
    `prefetch_budget`, not the share a loaded device leaves (`budget_by_load`).
    """
    if speculation_gain <= 0.0:
        return 0.0
    return min(MAX_SPECULATION_THRESHOLD, speculation_gain / prefetch_budget)
