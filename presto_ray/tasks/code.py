"""HumanEval: run the task's tests on a completion, in a sandboxed subprocess.

Rows: `task_id`, `prompt` (the signature and docstring), `test` (defining `check(candidate)`),
`entry_point`. The program is HumanEval's: `prompt + completion + test + check(entry_point)`
when the completion continues the prompt; when it holds a whole definition of `entry_point`
(chat models answer so, often in a ``` fence), the fence's code follows the prompt instead (the
prompt's imports and helpers stay, the new definition replaces the stub).

**A pass is the harness's word, not an exit status.** The grader writes a random nonce into a pipe;
the harness reads it and closes the pipe before the untrusted code runs, keeps it where Python code
cannot reach it (in `min`'s C stack, not in any frame, global or object gc tracks), and writes it to
the verdict pipe only once the program, `check(entry_point)` included, has run to its end; then it
ends the process with `os._exit` (no atexit handler, no `__del__` runs after). `passed` means the
grader read exactly its nonce back; `sys.exit(0)`, `os._exit(0)` or an atexit hook give `failed`.

**The boundary** (`_HARNESS`; docs/eval.md says what holds where). The grader starts the harness
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
import re
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from presto_ray.tasks.base import ERROR, FAILED, PASSED, TIMEOUT, DatasetError, Grade, Problem, text_field

NAME = "humaneval"
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


# Runs as `python -I -S harness.py CONFIG` in the sample's folder, as the grader's user: the
# namespaces, then the sample's process (forked), then its timeout (see the module's docstring).
_HARNESS = r'''
import builtins, json, os, sys
config = json.loads(sys.argv[1])
sys.path[1:] = config["paths"]  # the grader's interpreter's, without site's .pth hooks (python -S)
NONCE, VERDICT, STATUS = config["fds"]
folder, uid, timeout = config["folder"], config["uid"], config["timeout"]
with open("program.py") as f:
    source = f.read()
import ctypes, resource, select, signal, time
libc = ctypes.CDLL(None, use_errno=True)
NEWNS, NEWIPC, NEWUSER, NEWPID, NEWNET = 0x20000, 0x8000000, 0x10000000, 0x20000000, 0x40000000
if uid is not None and os.geteuid() == 0:  # root: a user and namespaces of the sample's own
    attempts = [(NEWNS | NEWPID | NEWNET | NEWIPC, ["pid", "mount", "network", "ipc"]), (NEWNET, ["network"])]
else:  # what an unprivileged user may make (user namespaces), else nothing
    uid = None
    attempts = [(NEWPID | NEWNET, ["pid", "network"]), (NEWUSER | NEWPID | NEWNET, ["pid", "network"]),
                (NEWUSER | NEWNET, ["network"]), (NEWNET, ["network"])]
held = []
for flags, names in attempts:
    if libc.unshare(flags) == 0:
        held = names
        break
paths = [p for p in sys.path[1:] if os.path.isdir(p)]  # where the interpreter imports from


def closed(path):
    """The first folder on the way to `path` that other users cannot enter, or None."""
    here = "/"
    for part in [p for p in path.split("/") if p]:
        here = os.path.join(here, part)
        if not os.stat(here).st_mode & 0o001:
            return here
    return None


if uid is not None and "mount" not in held and any(closed(p) for p in paths + [os.path.dirname(folder)]):
    uid = None  # another user could not import the standard library: the fallback
os.umask(0o022)
parent = os.getpid()
pid = os.fork()
if pid == 0:  # the sample's process (process 1 of its PID namespace where one was made)
    os.close(STATUS)
    try:
        def call(result, what):
            if result != 0:
                e = ctypes.get_errno()
                raise OSError(e, f"{what}: {os.strerror(e)}")

        def mount(source, target, fstype, flags, data=None):
            enc = lambda s: None if s is None else s.encode()
            call(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")

        RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
        if "mount" in held:
            mount(None, "/", None, REC | PRIVATE)  # nothing below propagates to the grader's mounts
            shared = [d for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock") if os.path.isdir(d) and not os.path.islink(d)]
            covers = sorted(set(shared) | {c for c in map(closed, paths + [os.path.dirname(folder)]) if c})
            covers = [c for c in covers if not any(c.startswith(o + "/") for o in covers)]
            under = lambda p, c: p == c or p.startswith(c + "/")
            kept = [p for p in paths if any(under(p, c) for c in covers)]
            kept = [p for p in kept if not any(p.startswith(k + "/") for k in kept)]
            handles = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in kept}
            for c in covers:  # empty, root's, 0755: the sample cannot write there
                mount("tmpfs", c, "tmpfs", NOSUID | NODEV | NOEXEC, "mode=755,size=64k,nr_inodes=64")
            for p, handle in handles.items():  # the interpreter's folders back, read-only
                os.makedirs(p, exist_ok=True)
                mount(f"/proc/self/fd/{handle}", p, None, BIND | REC)
                mount(None, p, None, REMOUNT | BIND | RDONLY | NOSUID | NODEV)
                os.close(handle)
            os.makedirs(folder, exist_ok=True)
            size = config["folder_bytes"]
            mount("tmpfs", folder, "tmpfs", NOSUID | NODEV | NOEXEC,
                  f"mode=700,uid={uid},gid={uid},size={size},nr_inodes=4096")
            mount("proc", "/proc", "proc", NOSUID | NODEV | NOEXEC)  # only this namespace's processes
        elif uid is not None:
            os.chown(folder, uid, uid)
        if "pid" not in held:
            os.setpgid(0, 0)  # a group of its own, which the harness kills afterwards
        os.chdir(folder)
        nproc = config["processes"] if uid is not None else 0  # 0: the grader's own uid, no new process
        for limit, value in ((resource.RLIMIT_CPU, config["cpu"]), (resource.RLIMIT_AS, config["memory"]),
                             (resource.RLIMIT_FSIZE, config["fsize"]), (resource.RLIMIT_CORE, 0),
                             (resource.RLIMIT_NPROC, nproc)):
            try:
                resource.setrlimit(limit, (value, value))
            except (ValueError, OSError):
                if uid is not None:
                    raise
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            if (os.getuid(), os.geteuid(), os.getgid(), os.getegid()) != (uid,) * 4:
                raise OSError("the sample's uid and gid did not take")
        call(libc.prctl(38, 1, 0, 0, 0), "no new privileges")  # PR_SET_NO_NEW_PRIVS
        call(libc.prctl(1, signal.SIGKILL, 0, 0, 0), "parent-death signal")  # PR_SET_PDEATHSIG, after setuid
        if "pid" not in held and os.getppid() != parent:
            os._exit(9)  # the harness is gone already
    except BaseException as e:
        os.write(VERDICT, b"setup: " + str(e).encode()[:500])
        os._exit(3)
    del libc, ctypes
    for name in [n for n in sys.modules if n == "ctypes" or n.startswith("ctypes.") or n == "_ctypes"]:
        del sys.modules[name]
    import socket, _socket

    def _refused(*args, **kwargs):
        raise PermissionError("disabled in the sandbox")

    for name in ("socket", "create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo"):
        setattr(socket, name, _refused)
    _socket.socket = _refused
    sys.settrace = sys.setprofile = _refused  # a trace function could jump over the tests' lines
    blocked = ["ctypes", "_ctypes"]
    if uid is None:  # the fallback: HumanEval's reliability guard, over os, posix and io
        import io, _io, posix, shutil, subprocess
        _open, _FileIO = builtins.open, _io.FileIO
        _write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC

        def _inside(path):
            if isinstance(path, int):
                return True
            real = os.path.realpath(os.fsdecode(path))
            return real == folder or real.startswith(folder + os.sep)

        def _refuse_outside(path):
            if not _inside(path):
                raise PermissionError(f"writing outside the sandbox: {os.fsdecode(path)}")

        def _guarded_open(file, mode="r", *args, **kwargs):
            if any(c in mode for c in "wax+"):
                _refuse_outside(file)
            return _open(file, mode, *args, **kwargs)

        def _relative_to_fd(kwargs):
            if any(kwargs.get(k) is not None for k in ("dir_fd", "src_dir_fd", "dst_dir_fd")):
                raise PermissionError("paths relative to a descriptor are disabled in the sandbox")

        def _path_guard(real, paths=1):
            def guarded(*args, **kwargs):
                _relative_to_fd(kwargs)
                for path in args[:paths]:
                    _refuse_outside(path)
                return real(*args, **kwargs)
            return guarded

        _os_open = os.open

        def _guarded_os_open(path, flags, *args, **kwargs):
            _relative_to_fd(kwargs)
            if flags & _write_flags:
                _refuse_outside(path)
            return _os_open(path, flags, *args, **kwargs)

        class _GuardedFileIO(_FileIO):
            def __init__(self, file, mode="r", *args, **kwargs):
                if any(c in mode for c in "wax+"):
                    _refuse_outside(file)
                super().__init__(file, mode, *args, **kwargs)

        builtins.open = io.open = _io.open = _guarded_open
        io.FileIO = _io.FileIO = _GuardedFileIO
        for module in (os, posix):
            module.open = _guarded_os_open
            for name, paths in (("mkdir", 1), ("mkfifo", 1), ("mknod", 1), ("utime", 1), ("remove", 1), ("unlink", 1),
                                ("rmdir", 1), ("truncate", 1), ("rename", 2), ("replace", 2), ("link", 2)):
                if hasattr(module, name):  # inside its folder only (so tempfile works)
                    setattr(module, name, _path_guard(getattr(module, name), paths))
            for name in ("kill", "killpg", "system", "putenv", "removedirs", "fchdir", "setuid", "fork", "forkpty",
                         "renames", "fchmod", "fchown", "chmod", "chown", "chroot", "lchown", "lchmod", "lchflags",
                         "chflags", "symlink", "chdir", "posix_spawn", "posix_spawnp", "spawnv", "spawnve", "spawnl",
                         "spawnle", "execv", "execve", "execl", "execle", "execlp", "execlpe", "execvp", "execvpe",
                         "popen", "setsid", "setpgid"):
                if hasattr(module, name):
                    setattr(module, name, _refused)
        shutil.rmtree = shutil.move = shutil.chown = _refused
        subprocess.Popen = subprocess.run = subprocess.call = subprocess.check_call = subprocess.check_output = _refused
        blocked += ["ipdb", "joblib", "resource", "psutil", "tkinter", "multiprocessing", "_posixsubprocess", "pty"]
    for name in blocked:
        sys.modules[name] = None
    _RUN, _write, _exit = object(), os.write, os._exit

    def _feed():
        yield os.read(NONCE, 64)  # the nonce: from here it lives only in min's C stack
        os.close(NONCE)
        yield _RUN

    def _key(item):
        if item is not _RUN:
            return 0
        exec(compile(source, "program.py", "exec"), {"__name__": "__main__", "__builtins__": builtins})
        return 1

    _write(VERDICT, min(_feed(), key=_key))  # reached only when the program ran to its end
    _exit(0)

# the harness: the sample's parent, its timeout, and what became of it
os.close(NONCE)
os.close(VERDICT)
deadline, timed_out = time.monotonic() + timeout, False
try:
    handle = os.pidfd_open(pid)
except (AttributeError, OSError):
    handle = None
while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    left = deadline - time.monotonic()
    if left <= 0:
        timed_out = True
        os.kill(pid, signal.SIGKILL)  # process 1 of its namespace: everything in it dies too
        done, status = os.waitpid(pid, 0)
        break
    if handle is not None:
        select.select([handle], [], [], left)
    else:
        time.sleep(min(left, 0.005))
if "pid" not in held:  # no namespace to die with it: its group, and as root every process of its uid
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    if uid is not None and os.fork() == 0:
        try:
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    if uid is not None:
        os.wait()
report = {"held": held, "uid": uid, "timeout": timed_out}
if os.WIFSIGNALED(status):
    report["signal"] = os.WTERMSIG(status)
else:
    report["exit"] = os.WEXITSTATUS(status)
os.write(STATUS, json.dumps(report).encode())
os._exit(0)
'''


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
        (work / "harness.py").write_text(_HARNESS)
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


def grade(problem: Problem, completion: str, limits: Limits = Limits()) -> Grade:
    return run_program(program(problem, completion), limits)


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
