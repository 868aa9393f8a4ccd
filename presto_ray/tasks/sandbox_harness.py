"""The program that runs inside the code sandbox, as its source text (presto_ray/tasks/sandbox.py
writes it into the sample's folder and starts it). It is text, not a module of this package: it
runs in a bare interpreter (`python -I -S`), patches that interpreter's modules to guard the
sample, and must never be imported here."""

# Runs as `python -I -S harness.py CONFIG` in the sample's folder, as the grader's user: the
# namespaces, then the sample's process (forked), then its timeout (see the module's docstring).
HARNESS = r'''
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
