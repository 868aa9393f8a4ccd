"""One way for a test to wait: poll a condition until it holds or a deadline passes.

Tests never sleep to order events; they wait for what they need and fail, naming it, when it
does not come.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.05) -> T:
    """Call `condition` until it returns something truthy, and return that; raise AssertionError
    naming `what` if `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)
