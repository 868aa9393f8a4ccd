"""A Ray cluster of its own whose head can be lost: `ray start --head --block` in a subprocess
(its own session and temp dir, so no other Ray user of this machine finds it), for the drivers
that join it as from another machine (RAY_ADDRESS, --address) and the tests that SIGKILL its
whole process tree (tests/test_head_loss.py: a job; tests/test_service_head_loss.py: the
service). The multi-node cluster of tests/multinode.py never loses its head."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from multinode import REPO
from waiting import wait_for

from presto_ray.process_watchdog import process_tree, start_time

RAY = Path(sys.executable).with_name("ray")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without RAY_ADDRESS (the test runs set it to `local`), with the
    repository importable, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return {**env, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO), **extra}


def own_lines(log: Path) -> list[str]:
    """The lines of ours in a command's output (Ray's own log lines start otherwise)."""
    return [line for line in log.read_text().splitlines() if line.startswith("presto-ray:")]


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def ended_after_head_loss(head: "Head", process: subprocess.Popen, log: Path, what: str, timeout_s: float = 90) -> float:
    """Lose `head` under `process` (a driver joined to it) and wait for the process to end: the
    seconds from the kill to its end; fails, with its log, if it does not end within `timeout_s`."""
    killed_at = head.lose()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{what} did not end within {timeout_s:g} s of the head's loss:\n{log.read_text()}") from None
    return time.monotonic() - killed_at


class Head:
    """`ray start --head --block` in its own session; `lose()` SIGKILLs its whole process tree.
    `env`: more of the head's environment (what its workers inherit)."""

    def __init__(self, workdir: Path, num_cpus: int = 2, **env: str) -> None:
        self.port = free_port()
        self.temp_dir = tempfile.mkdtemp(prefix="phl", dir="/tmp")  # short: Ray's socket paths live there
        self.log = workdir / "head.log"
        with self.log.open("w") as sink:
            self.process = subprocess.Popen(
                [str(RAY), "start", "--head", f"--port={self.port}", f"--num-cpus={num_cpus}", "--include-dashboard=false",
                 "--disable-usage-stats", "--node-ip-address=127.0.0.1", f"--temp-dir={self.temp_dir}", "--block"],
                env=clean_env(**env), stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.pids: set[int] = set()
        wait_for(self._answers, 120, "the head to take connections", interval_s=0.5)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _answers(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()
        return answers(self.port)

    def lose(self) -> float:
        """SIGKILL the head's process tree; when (time.monotonic())."""
        self.pids = {self.process.pid, *process_tree(self.process.pid)}
        killed_at = time.monotonic()
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait()
        return killed_at

    def left_running(self) -> list[int]:
        self.pids |= {self.process.pid, *process_tree(self.process.pid)} if self.process.poll() is None else set()
        return sorted(pid for pid in self.pids if start_time(pid) is not None)

    def remove(self) -> None:
        """Lose the head if it still runs, and remove its temp dir."""
        if self.process.poll() is None:
            self.lose()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
