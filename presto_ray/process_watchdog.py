"""A watchdog that stops what a killed driver leaves running: its process tree, read from /proc.

Some processes outlive a SIGKILLed driver: a local Ray's dashboard and runtime-env agents
(actors/cluster.py), and vLLM's EngineCore and its worker, which the in-process engine spawns
(measured: 3 processes, 8.1 GB RSS left by `presto-ray sample` killed while sampling). A driver
calls `start_watchdog(folder)`: a small process in its own session (stdlib only, a few MB)
keeps a record of the driver's process tree in `folder` and, once the driver is gone, stops what
is left of it. Should the watchdog be killed too, the next run's `reap(folder)` stops them from
the record it left.

Processes are named by (pid, start time in clock ticks since boot), so a pid the system reused is
never touched. Linux only (it reads /proc); elsewhere `start_watchdog` does nothing.

This module imports nothing but the standard library (not even its own package), so it runs on
its own by path, whatever the working directory or how presto-ray is installed:

    python -I path/to/process_watchdog.py watch RECORD.json   # what start_watchdog runs
    python -I path/to/process_watchdog.py reap FOLDER         # prints how many it stopped
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path


def records_folder(kind: str) -> Path:
    """Where the watchdogs of one kind of process tree ("local-ray", "engine") keep their records:
    one folder per user under the temporary directory, so one user's reap never reads another's."""
    import tempfile

    return Path(tempfile.gettempdir()) / f"presto-ray-{kind}-{os.getuid()}"


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (field 3, the state, first), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot), or None if it is gone or a zombie (which holds
    nothing but its pid)."""
    fields = _stat_fields(pid)
    try:
        return None if fields is None or fields[0] == "Z" else int(fields[19])
    except (IndexError, ValueError):
        return None


def is_alive(process: Sequence[int] | None) -> bool:
    """Whether this (pid, start time) still runs (a record's JSON gives it as a list)."""
    return process is not None and len(process) == 2 and start_time(process[0]) == process[1]


def children() -> dict[int, list[int]]:
    """Every process's children, by parent pid (one pass over /proc)."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := _stat_fields(int(name))) is not None:
            try:
                kids.setdefault(int(fields[1]), []).append(int(name))
            except (IndexError, ValueError):
                pass
    return kids


def process_tree(*roots: int) -> dict[int, int]:
    """The live descendants of `roots` (not the roots themselves): pid -> start time."""
    kids = children()
    found: dict[int, int] = {}
    todo = [pid for root in roots for pid in kids.get(root, [])]
    while todo:
        pid = todo.pop()
        if pid not in found and (started := start_time(pid)) is not None:
            found[pid] = started
            todo.extend(kids.get(pid, []))
    return found


def kill(processes: Iterable[Sequence[int]]) -> int:
    """SIGKILL each (pid, start time) that still runs; how many were signalled."""
    stopped = 0
    for pid, started in processes:
        if start_time(pid) == started:
            try:
                os.kill(pid, signal.SIGKILL)
                stopped += 1
            except OSError:
                pass
    return stopped


def _write(path: Path, record: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def watch(record_path: Path, poll_s: float = 0.5, grace_s: float = 3.0) -> int:
    """The watchdog's loop: while the record's driver runs, add its process tree to the record;
    once it is gone, wait `grace_s` (a driver that exited stops its own children), then stop what
    is left of the tree and delete the record. How many it stopped.

    A process the driver started less than `poll_s` before it died is missed, unless one of the
    recorded processes started it (the final walk starts from them too)."""
    record = json.loads(record_path.read_text())
    me = os.getpid()
    record["watchdog"] = [me, start_time(me)]
    driver = record["driver"]
    known: dict[int, int] = {}
    while is_alive(driver):
        found = {pid: t for pid, t in process_tree(driver[0]).items() if pid != me}
        if found.items() - known.items() or "procs" not in record:
            known.update(found)
            record["procs"] = sorted(known.items())
            _write(record_path, record)
        time.sleep(poll_s)
    time.sleep(grace_s)
    live = [pid for pid, t in known.items() if start_time(pid) == t]
    known.update({pid: t for pid, t in process_tree(*live).items() if pid != me})  # orphans' children
    stopped = kill(known.items())
    record_path.unlink(missing_ok=True)
    return stopped


def reap(folder: Path) -> int:
    """Stop the processes recorded in `folder` whose driver and watchdog are both gone (the
    watchdog was killed with its driver); how many. Each such record is deleted."""
    stopped = 0
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if is_alive(record.get("driver")) or is_alive(record.get("watchdog")):
            continue
        stopped += kill(record.get("procs", []))
        path.unlink(missing_ok=True)
    return stopped


def reap_left_behind(folder: Path, what: str) -> int:
    """`reap(folder)`, said on stderr when it stopped anything (`what`: whose processes)."""
    stopped = reap(folder)
    if stopped:
        print(f"presto-ray: stopped {stopped} {what} process(es) left behind by a killed run", file=sys.stderr)
    return stopped


def start_watchdog(folder: Path, **extra: object) -> Path | None:
    """Watch this process's tree from now on: write its record in `folder` (with `extra` keys)
    and start the watchdog in its own session; the record's path, or None where it cannot
    (not Linux, an unwritable folder)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        me = os.getpid()
        record = folder.resolve() / f"{me}-{start_time(me)}.json"
        _write(record, {"driver": [me, start_time(me)], **extra})
        subprocess.Popen(
            [sys.executable, "-I", str(Path(__file__).resolve()), "watch", str(record)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, cwd="/",
        )  # fmt: skip
    except (OSError, ValueError):
        return None  # no watchdog: the processes' own clean-up only
    return record


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "watch":
        watch(Path(argv[1]))
        return 0
    if len(argv) == 2 and argv[0] == "reap":
        print(reap(Path(argv[1])))
        return 0
    print("usage: process_watchdog.py watch RECORD.json | reap FOLDER", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
