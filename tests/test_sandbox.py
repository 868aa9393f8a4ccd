"""The HumanEval sandbox against an attacker (issue 32): a pass must mean the tests ran to their
end, and the sample must not reach files, processes or secrets outside its folder. Real
subprocesses, real attacks; the OS-boundary tests need root (they are skipped elsewhere)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from presto_ray.tasks.code import grade, problem_from_row
from presto_ray.tasks.sandbox import Limits, describe_sandbox, os_boundary, run_program

LIMITS = Limits(timeout_s=3.0)
ROW = {
    "task_id": "HumanEval/0",
    "prompt": 'def add(xs):\n    """Sum of xs."""\n',
    "test": "def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\n",
    "entry_point": "add",
}
PROBLEM = problem_from_row(ROW, "HumanEval/0", "f line 1")
needs_boundary = pytest.mark.skipif(not os_boundary(), reason=f"no OS boundary here: {describe_sandbox()}")


# --- a pass is the harness's word after `check` returned, not the exit status ------------------------

EXIT_ZERO = {
    "sys.exit(0)": "    return 0\n\nimport sys\nsys.exit(0)\n",
    "os._exit(0)": "    return 0\n\nimport os\nos._exit(0)\n",
    "atexit os._exit(0)": "    return 0\n\nimport atexit, os\natexit.register(lambda: os._exit(0))\n",
    "fenced raise SystemExit(0)": "```python\ndef add(xs):\n    raise SystemExit(0)\n```\n",
    "SystemExit in a finally": "    try:\n        return 0\n    finally:\n        raise SystemExit(0)\n",
    "a reassuring line, then exit 0": "    return 0\n\nimport sys\nprint('3 tests passed', file=sys.stderr)\nsys.exit()\n",
}


@pytest.mark.parametrize("completion", EXIT_ZERO.values(), ids=EXIT_ZERO.keys())
def test_ending_the_process_with_status_0_is_not_a_pass(completion):
    result = grade(PROBLEM, completion, LIMITS)
    assert not result.correct and result.status == "failed", result
    assert result.detail.startswith("exited with status 0 before its tests ran to their end"), result


# writes whatever it can read from any descriptor (a nonce pipe left open) to every descriptor
FD_FORGERY = """
import os
seen = []
for fd in range(3, 256):
    try:
        os.set_blocking(fd, False)
        seen.append(os.read(fd, 4096))
    except OSError:
        pass
for fd in range(3, 256):
    for data in seen:
        try:
            os.write(fd, data)
        except OSError:
            pass
os._exit(0)
"""

# looks for a nonce in the interpreter (every object gc tracks, every frame's locals and globals,
# closures) and writes each candidate to every descriptor
GC_FORGERY = r"""
import gc, os, re, sys
hexes, seen = re.compile(rb"^[0-9a-f]{16,128}$"), set()
def look(value):
    if isinstance(value, str):
        value = value.encode("ascii", "replace")
    if isinstance(value, (bytes, bytearray)) and hexes.match(bytes(value)):
        seen.add(bytes(value))
for obj in gc.get_objects():
    look(obj)
    for ref in gc.get_referents(obj):
        look(ref)
frame = sys._getframe()
while frame is not None:
    for value in list(frame.f_locals.values()) + list(frame.f_globals.values()):
        look(value)
        for cell in getattr(value, "__closure__", None) or ():
            look(cell.cell_contents)
    frame = frame.f_back
for fd in range(3, 256):
    for data in seen:
        try:
            os.write(fd, data)
        except OSError:
            pass
os._exit(0)
"""


@pytest.mark.parametrize("attack", [FD_FORGERY, GC_FORGERY], ids=["descriptors", "interpreter"])
def test_the_verdict_cannot_be_forged(attack):
    result = grade(PROBLEM, "    return 0\n" + attack, LIMITS)
    assert not result.correct and result.status == "failed", result


# --- the OS boundary: files, processes, signals, secrets ------------------------------------------


def _leftover(marker: str) -> list[int]:
    """Pids of `sleep <marker>` processes still alive anywhere on the machine."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[:2] == [b"sleep", marker.encode()]:
                found.append(int(entry.name))
    return found


@needs_boundary
def test_posix_and_io_cannot_touch_anything_outside_the_folder(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    mark = f"presto-ray-attack-{random.randrange(1 << 30)}"
    shared = [Path(d) / mark for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock") if Path(d).is_dir()]
    attacks = {
        "io.FileIO": f"import io\nio.FileIO({str(tmp_path / 'fileio')!r}, 'w').write(b'x')\n",
        "_io.FileIO": f"import _io\n_io.FileIO({str(tmp_path / 'fileio2')!r}, 'w').write(b'x')\n",
        "posix.open": f"import posix\nposix.close(posix.open({str(tmp_path / 'posix')!r}, posix.O_CREAT | posix.O_WRONLY))\n",
        "os.makedirs": f"import os\nos.makedirs({str(tmp_path / 'made' / 'dirs')!r})\n",
        "posix.mkdir": f"import posix\nposix.mkdir({str(tmp_path / 'made2')!r})\n",
        "posix.unlink": f"import posix\nposix.unlink({str(victim)!r})\n",
        "posix.rename": f"import posix\nposix.rename({str(victim)!r}, {str(tmp_path / 'moved')!r})\n",
        "posix.system": f"import posix\nassert posix.system('touch {tmp_path / 'system'}') == 0\n",
        "shared folders": "".join(f"open({str(p)!r}, 'w').write('x')\n" for p in shared),
    }
    try:
        for name, attack in attacks.items():
            result = run_program(attack, LIMITS)
            assert not result.correct, (name, result)
        assert victim.read_text() == "keep"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["victim.txt"]
        assert [p for p in shared if p.exists()] == []
    finally:
        for p in shared:
            p.unlink(missing_ok=True)


@needs_boundary
@pytest.mark.parametrize("processes, then", [(1, "return"), (8, "return"), (8, "loop")],
                         ids=["no fork", "the child dies with the sample", "the child dies at the timeout"])  # fmt: skip
def test_a_setsid_child_does_not_outlive_the_sample(processes, then):
    marker = f"{random.randrange(10**6, 10**7)}.5"
    attack = (
        "    import posix, time\n"
        "    if posix.fork() == 0:\n"
        "        posix.setsid()\n"
        f"        posix.execv('/bin/sleep', ['sleep', '{marker}'])\n"
        "    time.sleep(0.3)\n"
        + ("    return sum(xs)\n" if then == "return" else "    while True:\n        pass\n")
    )
    limits = Limits(timeout_s=2.0, processes=processes)
    try:
        result = grade(PROBLEM, attack, limits)
        if processes == 1:  # RLIMIT_NPROC of its own uid
            assert "Resource temporarily unavailable" in result.detail, result
        else:  # it forked: process 1 of its PID namespace took the child with it
            assert result.status == ("passed" if then == "return" else "timeout"), result
        time.sleep(0.3)
        assert _leftover(marker) == []
    finally:
        for pid in _leftover(marker):  # the escaped child (before the fix): ours to end
            os.kill(pid, signal.SIGKILL)


@needs_boundary
def test_processes_and_threads_are_counted_per_sample():
    threads = "import threading\nt = threading.Thread(target=print)\nt.start()\nt.join()\n"
    assert "can't start new thread" in run_program(threads, LIMITS).detail
    assert run_program(threads, Limits(timeout_s=3.0, processes=2)).correct


@needs_boundary
def test_the_sample_runs_as_a_user_of_its_own():
    ids = run_program("import os\nraise Exception(os.getuid(), os.getgid(), os.getgroups(), os.getpid())\n", LIMITS).detail
    uid, gid, groups, pid = eval(ids.removeprefix("Exception: "))
    assert uid != 0 and uid == gid and groups == [] and pid == 1, ids
    other = eval(run_program("import os\nraise Exception(os.getuid())\n", LIMITS).detail.removeprefix("Exception: "))
    assert other != uid  # one uid per sample: their limits and their processes are theirs alone
    for secret in ("open('/proc/self/mem', 'rb')", "open('/etc/shadow')", "import os\nos.listdir('/root/.ssh')"):
        assert not run_program(secret + "\n", LIMITS).correct, secret


@needs_boundary
def test_the_sample_cannot_kill_the_grader(tmp_path):
    dataset = tmp_path / "he.jsonl"
    dataset.write_text(json.dumps(ROW) + "\n")
    completions = tmp_path / "c.jsonl"
    kills = ["    import os, posix\n    posix.kill(os.getppid(), 9)\n    return sum(xs)\n",
             "    import os, posix\n    posix.killpg(posix.getpgid(0), 9)\n    return sum(xs)\n",
             "    import posix\n    posix.kill(-1, 19)\n    return sum(xs)\n"]  # fmt: skip
    completions.write_text("".join(json.dumps({"id": "HumanEval/0", "completion": c}) + "\n" for c in kills))
    folders = tmp_path / "tmp"
    folders.mkdir()
    out = tmp_path / "report.json"
    run = subprocess.run(
        [sys.executable, "-m", "presto_ray.cli", "grade", "--dataset", str(dataset), "--completions", str(completions),
         "--out", str(out), "--timeout", "3"],
        env={**os.environ, "TMPDIR": str(folders)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    report = json.loads(out.read_text())
    assert len(report["rows"]) == len(kills)
    assert list(folders.iterdir()) == []  # every sample's folder removed


@needs_boundary
def test_no_secret_reaches_the_report():
    shadow = [line for line in Path("/etc/shadow").read_text().splitlines() if line.strip()]
    attacks = [
        "    raise Exception(open('/etc/shadow').read().replace('\\n', ' '))\n",
        # the grader reads the sample's stderr: make it a link to the secret
        "    import posix\n    posix.unlink('stderr.txt')\n    posix.symlink('/etc/shadow', 'stderr.txt')\n"
        "    posix.close(2)\n    raise Exception\n",
    ]
    for attack in attacks:
        result = grade(PROBLEM, attack, LIMITS)
        assert not result.correct
        assert not any(line in result.detail for line in shadow), result.detail


# --- the fallback (not root): HumanEval's reliability guard, over os, posix and io -----------------


def test_the_python_guards_cover_posix_and_io(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    limits = Limits(timeout_s=3.0, os_boundary=False)
    attacks = {
        "io.FileIO": f"import io\nio.FileIO({str(tmp_path / 'fileio')!r}, 'w')\n",
        "_io.FileIO": f"import _io\n_io.FileIO({str(tmp_path / 'fileio2')!r}, 'w')\n",
        "posix.open": f"import posix\nposix.open({str(tmp_path / 'posix')!r}, posix.O_CREAT | posix.O_WRONLY)\n",
        "os.makedirs": f"import os\nos.makedirs({str(tmp_path / 'made' / 'dirs')!r})\n",
        "posix.mkdir": f"import posix\nposix.mkdir({str(tmp_path / 'made2')!r})\n",
        "posix.unlink": f"import posix\nposix.unlink({str(victim)!r})\n",
        "unlink by dir_fd": f"import os\nos.unlink('victim.txt', dir_fd=os.open({str(tmp_path)!r}, os.O_RDONLY))\n",
        "posix.rename": f"import posix\nposix.rename({str(victim)!r}, 'here')\n",
        "posix.system": f"import posix\nposix.system('touch {tmp_path / 'system'}')\n",
        "posix.fork": "import posix\nposix.fork()\n",
        "posix.kill": "import os, posix\nposix.kill(os.getppid(), 0)\n",
    }
    for name, attack in attacks.items():
        result = run_program(attack, limits)
        assert result.status == "failed" and ("outside the sandbox" in result.detail or "disabled" in result.detail), (name, result)
    assert victim.read_text() == "keep" and sorted(p.name for p in tmp_path.iterdir()) == ["victim.txt"]
    # the standard library still works inside the folder (tempfile writes, renames and unlinks there)
    inside = "import os, random, tempfile\nfd, path = tempfile.mkstemp()\nos.rename(path, 'x')\nos.unlink('x')\nrandom.random()\n"
    assert run_program(inside, limits).correct


def test_without_namespaces_the_fallback_still_grades(monkeypatch):
    """Where no namespace can be made (a container without CAP_SYS_ADMIN: unshare fails), samples
    still run: as their own uid where the interpreter is reachable by other users, else guarded."""
    from presto_ray.tasks import sandbox

    monkeypatch.setattr(sandbox, "HARNESS", sandbox.HARNESS.replace("if libc.unshare(flags) == 0:", "if False:"))
    result, report = sandbox._run("import os\nraise Exception(os.getpid() != 1)\n", LIMITS)
    assert report["held"] == [] and result.detail == "Exception: True", (result, report)
    assert grade(PROBLEM, "    return sum(xs)\n", LIMITS).correct
    assert not grade(PROBLEM, "    return 0\n\nimport os\nos._exit(0)\n", LIMITS).correct
