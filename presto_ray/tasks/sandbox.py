"""The code sandbox: run an untrusted Python program and say whether it ran to its end.

**A pass is the harness's word, not an exit status.** The grader writes a random nonce into a pipe;
the harness reads it and closes the pipe before the untrusted code runs, keeps it where Python code
cannot reach it (in `min`'s C stack, not in any frame, global or object gc tracks), and writes it to
the verdict pipe only once the program, `check(entry_point)` included, has run to its end; then it
ends the process with `os._exit` (no atexit handler, no `__del__` runs after). `passed` means the
grader read exactly its nonce back; `sys.exit(0)`, `os._exit(0)` or an atexit hook give `failed`.

**The boundary** (presto_ray/tasks/sandbox_harness.py; docs/eval.md says what holds where). The grader starts the harness
(`python -I`, an empty environment, a session of its own); the harness makes the namespaces,
forks the sample's process and, as the sample's parent, enforces the wall-clock timeout. When the
grader runs as root, the sample:

- runs as a user of its own (a fresh uid and gid per sample, no supplementary groups, no new
  privileges: setuid binaries do not raise it): it cannot write, delete or rename anything a
  root-owned file system does not give every user, read /etc/shadow, or signal the grader;
- is process 1 of its own PID namespace: when it exits, or the harness kills it at the timeout,
  the kernel kills everything it started (a `fork()` + `setsid()` child included); it has
  PR_SET_PDEATHSIG, so it dies with the harness;
- has its own mount namespace: its folder is a fresh tmpfs (size-limited) at the same path,
  /tmp, /var/tmp, /dev/shm and /run/lock are empty read-only-for-it tmpfs, a folder closed to other
  users that holds the interpreter (e.g. /root for a pyenv Python) is covered by an empty tmpfs
  with only the interpreter's folders bound back read-only, and /proc shows only its namespace;
- has its own network namespace (no interface but a downed loopback) and IPC namespace;
- has RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_CORE 0 and RLIMIT_NPROC (per uid, so per
  sample: 1 by default, no fork and no thread).

Inside that boundary the Python-level guards are narrow (sockets, tracing, ctypes) and the standard
library works. Where the grader is not root (or `Limits.os_boundary` is False) the sample runs as
the grader's user, in the namespaces an unprivileged user may make (PID and network ones where user
namespaces are allowed), under HumanEval's reliability guard extended to `posix` and `io`: those
guards are not a security boundary (code that reaches the interpreter's internals can undo them).
"""

from __future__ import annotations

import json
import os
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from presto_ray.tasks.base import ERROR, FAILED, PASSED, TIMEOUT, Grade
from presto_ray.tasks.sandbox_harness import HARNESS
MIN_MEMORY_MB = 64  # the interpreter and the harness need about 40 MiB of address space
# the samples' uids: one per sample, drawn from 2^24 uids above the ranges container tools
# allocate (systemd-nspawn's ends at 1878982655) and below systemd's own (2147352576)
SAMPLE_UIDS = range(0x7E000000, 0x7F000000)


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 5.0  # wall clock per sample
    memory_mb: int = 1024  # address space
    file_size_mb: int = 16  # the largest file it may write (its folder holds 4x that in all)
    processes: int = 1  # with a uid of its own: the processes and threads it may have (1: no fork, no thread)
    os_boundary: bool = True  # as root: run each sample as a user of its own in its own namespaces

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, not {self.timeout_s}")
        if self.memory_mb < MIN_MEMORY_MB:
            raise ValueError(f"memory_mb must be at least {MIN_MEMORY_MB} (MiB of address space), not {self.memory_mb}")
        if self.file_size_mb < 1 or self.processes < 1:
            raise ValueError("file_size_mb and processes must be at least 1")



def _sample_uid() -> int:
    """A uid of the sample's own (random in SAMPLE_UIDS, where this user namespace maps them), else nobody."""
    try:
        ranges = [tuple(map(int, line.split())) for line in Path("/proc/self/uid_map").read_text().splitlines()]
    except (OSError, ValueError):
        ranges = []
    if any(inner <= SAMPLE_UIDS.start and SAMPLE_UIDS.stop <= inner + count for inner, _, count in ranges):
        return SAMPLE_UIDS.start + secrets.randbelow(len(SAMPLE_UIDS))  # not `random`: the caller's seed stays untouched
    return 65534


def _read_all(fd: int, limit: int = 1 << 16) -> bytes:
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    try:
        while sum(map(len, chunks)) < limit and (chunk := os.read(fd, 4096)):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    return b"".join(chunks)


def _run(source: str, limits: Limits) -> tuple[Grade, dict]:
    """Run `source` in the sandbox; the grade and the harness's report (what held, how it ended)."""
    with tempfile.TemporaryDirectory(prefix="presto-ray-code-") as folder:
        work = Path(folder).resolve()
        (work / "program.py").write_text(source)
        (work / "harness.py").write_text(HARNESS)
        nonce = secrets.token_hex(16).encode()
        nonce_r, nonce_w = os.pipe()
        verdict_r, verdict_w = os.pipe()
        status_r, status_w = os.pipe()
        os.write(nonce_w, nonce)
        os.close(nonce_w)
        config = {
            "fds": [nonce_r, verdict_w, status_w], "folder": str(work), "timeout": limits.timeout_s,
            "uid": _sample_uid() if limits.os_boundary else None, "processes": limits.processes,
            "cpu": max(1, int(limits.timeout_s) + 1), "memory": limits.memory_mb << 20,
            "fsize": limits.file_size_mb << 20, "folder_bytes": 4 * limits.file_size_mb << 20,
            "paths": [p for p in sys.path if os.path.isabs(p) and p.startswith((sys.prefix, sys.base_prefix))],
        }  # fmt: skip
        env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "TMPDIR": str(work), "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
        # read through the grader's own descriptors: a sample that swaps stderr.txt for a link reads nothing through them
        with open(work / "stdout.txt", "wb") as out, open(work / "stderr.txt", "w+b") as err:
            start = time.monotonic()
            try:
                try:
                    harness = subprocess.Popen(
                        [sys.executable, "-I", "-S", "harness.py", json.dumps(config)], cwd=work, stdin=subprocess.DEVNULL,
                        stdout=out, stderr=err, start_new_session=True, env=env, pass_fds=(nonce_r, verdict_w, status_w),
                    )  # fmt: skip
                except OSError as e:
                    return Grade(False, ERROR, None, f"cannot start python: {e}"), {}
                finally:
                    for fd in (nonce_r, verdict_w, status_w):
                        os.close(fd)
                try:  # the harness enforces the timeout and reports (or dies: EOF); this is the backstop
                    waiting = select.poll()
                    waiting.register(status_r, select.POLLIN)
                    waiting.poll((limits.timeout_s + 10) * 1000)
                finally:
                    try:  # its session: the sample too, where it stayed in it (else its parent-death signal)
                        os.killpg(harness.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                    harness.wait()
                wall = time.monotonic() - start
                verdict, status = _read_all(verdict_r), _read_all(status_r)
            finally:
                os.close(verdict_r)
                os.close(status_r)
            err.seek(0, os.SEEK_END)
            err.seek(max(0, err.tell() - 2000))
            tail = err.read().decode("utf-8", "replace").strip().splitlines()
    try:
        report = json.loads(status)
    except ValueError:
        return Grade(False, TIMEOUT if wall >= limits.timeout_s else ERROR, None,
                     f"the harness did not report (after {wall:.1f} s){': ' + tail[-1][:300] if tail else ''}"), {}  # fmt: skip
    if verdict == nonce:
        return Grade(True, PASSED), report
    if verdict.startswith(b"setup: "):
        return Grade(False, ERROR, None, f"the sandbox could not be set up: {verdict[7:].decode('utf-8', 'replace')}"), report
    if report["timeout"] or report.get("signal") in (signal.SIGXCPU, signal.SIGKILL):
        return Grade(False, TIMEOUT, None, f"killed after {wall:.1f} s"), report
    if tail and report.get("exit") != 0:
        return Grade(False, FAILED, None, tail[-1][:300]), report
    ended = f"killed by signal {report['signal']}" if "signal" in report else f"exited with status {report['exit']}"
    said = f"; its last line on stderr: {tail[-1][:200]}" if tail else ""
    return Grade(False, FAILED, None, f"{ended} before its tests ran to their end{said}"), report


def run_program(source: str, limits: Limits = Limits()) -> Grade:
    """Run `source` in the sandbox: passed (it ran to its end: the harness's nonce came back),
    failed (it raised, or ended the process first), timeout, or error (the sandbox could not run it)."""
    return _run(source, limits)[0]


@lru_cache(maxsize=4)
def sandbox_report(limits: Limits = Limits()) -> dict:
    """What holds for a sample under `limits` on this machine: {"uid": its uid or None (the
    grader's own), "held": the namespaces made}; one trivial sample is run to see."""
    result, report = _run("pass\n", limits)
    if not result.correct:
        raise RuntimeError(f"the code sandbox cannot run a trivial program: {result.status}: {result.detail}")
    return {"uid": report["uid"], "held": report["held"]}


def os_boundary() -> bool:
    """Whether samples run as users of their own in their own PID and mount namespaces here."""
    report = sandbox_report()
    return report["uid"] is not None and {"pid", "mount"} <= set(report["held"])


def describe_sandbox(limits: Limits = Limits()) -> str:
    """One line saying what holds for the samples on this machine (docs/eval.md says what each means)."""
    try:
        report = sandbox_report(limits)
    except RuntimeError as e:
        return str(e)
    spaces = ", ".join(report["held"]) or "no"
    if report["uid"] is not None:
        return f"each sample runs as a uid of its own in its own {spaces} namespaces"
    return (f"each sample runs as this user ({os.geteuid()}) in {spaces} namespaces of its own, under Python-level guards "
            "only: not a security boundary (docs/eval.md)")  # fmt: skip
