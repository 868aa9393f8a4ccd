"""`make test`'s runner (tools/run_tests.py): the statistical part must get only idle cycles.

Linux's autogroups give each session a fair share of the CPU whatever the priorities inside it, so
the background part, started in its own session, took half of two cores while in SCHED_IDLE: the
light part's two workers then ran no faster than one.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tools.run_tests import AUTOGROUP, _idle_priority

REPORT = "import os; print(os.sched_getscheduler(0)); print(open('/proc/self/autogroup').read())"


@pytest.mark.skipif(not os.path.exists(AUTOGROUP), reason="no autogroups on this kernel")
def test_the_background_session_is_the_lightest_autogroup_and_idle_inside_it() -> None:
    child = subprocess.run(
        [sys.executable, "-c", REPORT], preexec_fn=_idle_priority, start_new_session=True,
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    policy, group = child.stdout.splitlines()[:2]
    assert int(policy) == os.SCHED_IDLE
    assert group.endswith("nice 19"), group
    with open(AUTOGROUP) as ours:
        assert not ours.read().strip().endswith("nice 19"), "the caller's own group must keep its weight"
