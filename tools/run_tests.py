"""`make test`: the whole suite in three parts, so that two cores do its work in less wall time.

Run serially the suite leaves a core idle for most of its length: the tests without vLLM or Ray are
single-threaded Python, and the Ray tests spend much of theirs waiting (for a node to be declared
dead, an actor to restart, a timeout to pass). So:

- **statistics**: the statistical tests (marked `slow`, neither vLLM nor Ray) start first, on
  pytest-xdist workers in the idle scheduling class (Linux's SCHED_IDLE, in the lightest autogroup;
  elsewhere the lowest nice): they run only on cycles the other parts leave free, so they slow no
  timed check. They are pure arithmetic with no clock in any assertion, which is why only they can
  be starved safely.
- **light**: the other tests without vLLM or Ray, on pytest-xdist workers (a module's tests
  together: tests/worker_groups.py).
- **engines**: the vLLM and Ray tests, in one process, one at a time, as before: each vLLM binds
  both cores, and the Ray tests time recoveries that a second worker would stretch.

Arguments are passed to every part's pytest (`-x`, `-k ...`). Exit status 0 only if every part
passed; a part that selects no test passes only when arguments narrowed the selection.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

LIGHT = "not vllm and not ray"
NO_TESTS_COLLECTED = 5  # pytest's exit status


@dataclass(frozen=True)
class Part:
    name: str
    marks: str
    workers: int
    durations: int


AUTOGROUP = "/proc/self/autogroup"


def _idle_priority() -> None:
    """In the child, after its setsid and before it runs pytest: run only on otherwise idle cycles
    (inherited by the xdist workers it starts)."""
    # With Linux's autogroup scheduling each session is a group that gets a fair share of the CPU
    # whatever the priorities inside it: the new session alone would take half of two cores, so its
    # group is made the lightest first (nice 19 weighs 15 against a default group's 1,024).
    try:
        with open(AUTOGROUP, "w") as group:
            group.write("19")
    except OSError:  # no autogroups here (not Linux, a kernel without them), or the kernel's rate limit
        pass
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    else:
        os.nice(19)


def _command(part: Part, extra: list[str]) -> list[str]:
    command = [sys.executable, "-m", "pytest", "-q", f"--durations={part.durations}", "-m", part.marks]
    if part.workers > 1:
        command += ["-n", str(part.workers), "--dist", "loadgroup"]
    return command + extra


def _passed(status: int, narrowed: bool) -> bool:
    return status == 0 or (narrowed and status == NO_TESTS_COLLECTED)


def main(argv: list[str]) -> int:
    workers = int(os.environ.get("TEST_WORKERS") or 2)
    statistics = Part("statistics", f"slow and {LIGHT}", workers, 5)
    light = Part("light", f"not slow and {LIGHT}", workers, 10)
    engines = Part("engines", "vllm or ray", 1, 15)
    started = time.monotonic()
    results: dict[str, tuple[int, float]] = {}
    with tempfile.TemporaryFile(mode="w+") as log:
        # its own session, so that an interrupted run stops it and its workers with it
        background = subprocess.Popen(
            _command(statistics, argv + ["-p", "no:cacheprovider"]),  # two pytests must not race for the cache
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=_idle_priority, start_new_session=True,
        )  # fmt: skip
        try:
            for part in (light, engines):
                print(f"== {part.name}: -m '{part.marks}'" + (f" on {part.workers} workers" if part.workers > 1 else ""), flush=True)
                t0 = time.monotonic()
                results[part.name] = (subprocess.call(_command(part, argv)), time.monotonic() - t0)
            print(f"== {statistics.name}: -m '{statistics.marks}', idle priority, beside the others", flush=True)
            status = background.wait()
            results[statistics.name] = (status, time.monotonic() - started)
        finally:
            if background.poll() is None:
                os.killpg(background.pid, 15)
                background.wait()
        log.seek(0)
        sys.stdout.write(log.read())
    narrowed = bool(argv)
    for name, (status, seconds) in results.items():
        verdict = "passed" if _passed(status, narrowed) else f"FAILED (pytest exit status {status})"
        print(f"{name:<11} {verdict} in {seconds:.0f} s")
    print(f"the suite: {time.monotonic() - started:.0f} s")
    return 0 if all(_passed(status, narrowed) for status, _ in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
