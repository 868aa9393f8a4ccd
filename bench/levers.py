"""The settings the benchmarks compare, one owner: the serial chain and each lever on top of it.

A setting is (name, schedule, traversal, early rejection); prefetching settings take the run's
prefetch budget, serial ones a budget of 1. bench/host_time.py (host time on the toy) and
bench/real_load.py (chains in flight on the real engine) run the same list."""

from __future__ import annotations

Setting = tuple[str, str, str, bool]  # (name, schedule, traversal, early rejection)

# serial chains (one request a step; in rounds every chain's request shares one call per round:
# the baseline), then each schedule's prefetching, each off and on
SETTINGS: tuple[Setting, ...] = (
    ("serial", "rounds", "serial", False),
    ("serial + early rejection", "rounds", "serial", True),
    ("rounds", "rounds", "predictive", False),
    ("rounds + early rejection", "rounds", "predictive", True),
    ("streaming", "streaming", "predictive", False),
    ("streaming + early rejection", "streaming", "predictive", True),
)
