"""HumanEval: run the task's tests on a completion, in a sandboxed subprocess.

Rows: `task_id`, `prompt` (the signature and docstring), `test` (defining `check(candidate)`),
`entry_point`. The program is HumanEval's: `prompt + completion + test + check(entry_point)`
when the completion continues the prompt; when it holds a whole definition of `entry_point`
(chat models answer so, often in a ``` fence), the fence's code follows the prompt instead (the
prompt's imports and helpers stay, the new definition replaces the stub).

The guards, in the child, before the untrusted code runs (`_HARNESS`):

- a wall-clock timeout (the parent kills the child's whole process group) and RLIMIT_CPU;
- RLIMIT_AS (address space), RLIMIT_FSIZE (file size), RLIMIT_CORE 0, RLIMIT_NPROC 0 (no new
  processes; the kernel ignores it for root, hence the next guard);
- HumanEval's reliability guard: os.fork, os.system, os.exec*, os.kill, subprocess.Popen,
  os.remove / rmdir / rename / chmod / chown, shutil.rmtree ... disabled;
- no network: a new network namespace when the kernel allows it (root, or unprivileged user
  namespaces), so no interface but a downed loopback exists; and always `socket.socket` and its
  relatives disabled at the Python level;
- file writes only inside the child's temporary folder (its working directory): `open`,
  `io.open`, `os.open` refuse to write elsewhere; ctypes is unavailable;
- an empty environment and isolated mode (`python -I`: no PYTHONPATH, no user site), output to
  files in the temporary folder (bounded by RLIMIT_FSIZE), the folder removed afterwards.

What is not guarded: the Python-level guards are not a security boundary. Code that reaches the
interpreter's internals (e.g. through gc or a C extension already loaded) can restore what was
disabled, read any file the user can read, and, without the namespace, open sockets. For
untrusted models' code at scale, run `presto-ray grade` inside a container or VM without network.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from presto_ray.tasks.base import ERROR, FAILED, PASSED, TIMEOUT, DatasetError, Grade, Problem, text_field

NAME = "humaneval"


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 5.0  # wall clock per sample
    memory_mb: int = 1024  # address space
    file_size_mb: int = 16  # the largest file it may write


def problem_from_row(row: dict, problem_id: str, where: str) -> Problem:
    prompt = text_field(row, "prompt", where)
    test = text_field(row, "test", where)
    entry_point = text_field(row, "entry_point", where)
    assert prompt is not None and test is not None and entry_point is not None
    if not entry_point.isidentifier():
        raise DatasetError(f"{where}: field 'entry_point' is {entry_point!r}, not a Python name")
    solution = row.get("canonical_solution")
    return Problem(
        problem_id, NAME, prompt, solution if isinstance(solution, str) else "",
        {"question": prompt, "prompt": prompt, "test": test, "entry_point": entry_point},
    )  # fmt: skip


_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def program(problem: Problem, completion: str) -> str:
    """The program that tests `completion` (see the module's docstring)."""
    prompt, test, entry_point = (problem.fields[k] for k in ("prompt", "test", "entry_point"))
    fences = [code for lang, code in _FENCE.findall(completion) if lang.lower() in ("", "python", "py", "python3")]
    defining = [code for code in fences if _defines(textwrap.dedent(code), entry_point)]
    if defining:
        body = textwrap.dedent(defining[-1])
    elif _defines(textwrap.dedent(completion), entry_point) and not fences:
        body = textwrap.dedent(completion)
    else:  # HumanEval's convention: the completion continues the prompt
        return f"{prompt}{fences[-1] if fences else completion}\n\n{test}\n\ncheck({entry_point})\n"
    head = prompt
    try:
        compile(f"{prompt}\n{body}", "<program>", "exec")
    except SyntaxError:
        head = ""  # a prompt that only parses when continued: the whole definition alone
    return f"{head}\n{body}\n\n{test}\n\ncheck({entry_point})\n"


# Runs in the child as `python -I harness.py`: limits, namespaces, guards, then the program.
_HARNESS = r'''
import builtins, io, os, resource, sys
sandbox = os.path.realpath(os.getcwd())
cpu, memory, fsize = (int(x) for x in sys.argv[1:4])
for limit, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, memory), (resource.RLIMIT_FSIZE, fsize),
                     (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, 0)):
    try:
        resource.setrlimit(limit, (value, value))
    except (ValueError, OSError):
        pass
try:  # a network namespace of its own: no interfaces (root, or unprivileged user namespaces)
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x40000000) != 0:  # CLONE_NEWNET
        libc.unshare(0x10000000 | 0x40000000)  # CLONE_NEWUSER | CLONE_NEWNET
    del libc, ctypes
except Exception:
    pass
for name in [n for n in sys.modules if n == "ctypes" or n.startswith("ctypes.") or n == "_ctypes"]:
    del sys.modules[name]
import socket, subprocess, shutil
def _refused(*args, **kwargs):
    raise PermissionError("disabled in the sandbox")
for name in ("socket", "create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo"):
    setattr(socket, name, _refused)
import _socket
_socket.socket = _refused
_open, _os_open = builtins.open, os.open
_write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
def _inside(path):
    if isinstance(path, int):
        return True
    real = os.path.realpath(os.fspath(path))
    return real == sandbox or real.startswith(sandbox + os.sep)
def _guarded_open(file, mode="r", *args, **kwargs):
    if any(c in mode for c in "wax+") and not _inside(file):
        raise PermissionError(f"writing outside the sandbox: {file}")
    return _open(file, mode, *args, **kwargs)
def _guarded_os_open(path, flags, *args, **kwargs):
    if flags & _write_flags and not _inside(path):
        raise PermissionError(f"writing outside the sandbox: {path}")
    return _os_open(path, flags, *args, **kwargs)
builtins.open = io.open = _guarded_open
os.open = _guarded_os_open
os.environ["OMP_NUM_THREADS"] = "1"
for name in ("kill", "killpg", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork",
             "forkpty", "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown", "chmod", "chown",
             "chroot", "lchown", "lchmod", "lchflags", "chflags", "link", "symlink", "chdir", "posix_spawn",
             "posix_spawnp", "spawnv", "spawnve", "spawnl", "spawnle", "execv", "execve", "execl", "execle",
             "execlp", "execlpe", "execvp", "execvpe", "popen", "register_at_fork", "setsid", "setpgid"):
    if hasattr(os, name):
        setattr(os, name, _refused)
shutil.rmtree = shutil.move = shutil.chown = _refused
subprocess.Popen = subprocess.run = subprocess.call = subprocess.check_call = subprocess.check_output = _refused
for name in ("ipdb", "joblib", "resource", "psutil", "tkinter", "ctypes", "_ctypes", "multiprocessing",
             "_posixsubprocess", "pty"):
    sys.modules[name] = None
with _open("program.py") as f:
    source = f.read()
exec(compile(source, "program.py", "exec"), {"__name__": "__main__", "__builtins__": builtins})
'''


def run_program(source: str, limits: Limits = Limits()) -> Grade:
    """Run `source` in the sandbox: passed (exit 0), failed (it raised), timeout, or error."""
    with tempfile.TemporaryDirectory(prefix="presto-ray-code-") as folder:
        work = Path(folder)
        (work / "program.py").write_text(source)
        (work / "harness.py").write_text(_HARNESS)
        cpu = max(1, int(limits.timeout_s) + 1)
        args = [sys.executable, "-I", "harness.py", str(cpu), str(limits.memory_mb << 20), str(limits.file_size_mb << 20)]
        with open(work / "stdout.txt", "wb") as out, open(work / "stderr.txt", "wb") as err:
            start = time.monotonic()
            try:
                child = subprocess.Popen(
                    args, cwd=work, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
                    env={"PATH": "/usr/bin:/bin", "HOME": str(work), "TMPDIR": str(work), "PYTHONHASHSEED": "0"},
                )  # fmt: skip
            except OSError as e:
                return Grade(False, ERROR, None, f"cannot start python: {e}")
            try:
                code = child.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                try:  # the whole group: anything it managed to start dies with it
                    os.killpg(child.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                child.wait()
            wall = time.monotonic() - start
        if code is None or code in (-signal.SIGXCPU, -signal.SIGKILL):
            return Grade(False, TIMEOUT, None, f"killed after {wall:.1f} s")
        if code == 0:
            return Grade(True, PASSED)
        tail = (work / "stderr.txt").read_bytes()[-2000:].decode("utf-8", "replace").strip().splitlines()
        return Grade(False, FAILED, None, tail[-1][:300] if tail else f"exit status {code}")


def grade(problem: Problem, completion: str, limits: Limits = Limits()) -> Grade:
    return run_program(program(problem, completion), limits)
