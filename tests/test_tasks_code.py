"""HumanEval: the program a completion makes, and the sandbox against right, wrong, unparseable and
malicious code (each run at most ~2 s)."""

from __future__ import annotations

import pytest

from presto_ray.tasks.code import Limits, grade, problem_from_row, program, run_program

LIMITS = Limits(timeout_s=2.0)
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


def test_writes_outside_the_temporary_folder_are_refused(tmp_path):
    target = tmp_path / "escaped.txt"
    for attack in (
        f"    open({str(target)!r}, 'w').write('x')\n    return sum(xs)\n",
        f"    import os\n    os.close(os.open({str(target)!r}, os.O_CREAT | os.O_WRONLY))\n    return sum(xs)\n",
        f"    import pathlib\n    pathlib.Path({str(target)!r}).write_text('x')\n    return sum(xs)\n",
    ):
        result = grade(PROBLEM, attack, LIMITS)
        assert result.status == "failed" and "outside the sandbox" in result.detail, result
    assert not target.exists()
    inside = "    open('scratch.txt', 'w').write('ok')\n    return sum(xs)\n"  # its own folder is writable
    assert grade(PROBLEM, inside, LIMITS).correct


def test_a_fork_bomb_is_limited():
    for attack in ("    import os\n    while True:\n        os.fork()\n",
                   "    import subprocess\n    subprocess.Popen(['sleep', '100'])\n",
                   "    import multiprocessing\n"):  # fmt: skip
        result = grade(PROBLEM, attack, LIMITS)
        assert result.status == "failed" and ("disabled" in result.detail or "halted" in result.detail), result


def test_the_network_is_refused():
    for attack in ("    import socket\n    socket.create_connection(('127.0.0.1', 80), timeout=1)\n",
                   "    import _socket\n    _socket.socket()\n",
                   "    import urllib.request\n    urllib.request.urlopen('http://127.0.0.1:1', timeout=1)\n"):  # fmt: skip
        result = grade(PROBLEM, attack, LIMITS)
        assert result.status == "failed" and not result.correct, result


def test_memory_and_ctypes_are_limited():
    assert "MemoryError" in run_program("x = bytearray(8 << 30)", LIMITS).detail
    assert run_program("import ctypes", LIMITS).status == "failed"


def test_bad_humaneval_rows():
    from presto_ray.tasks.base import DatasetError

    with pytest.raises(DatasetError, match="f line 2: field 'test' is missing"):
        problem_from_row({**ROW, "test": None}, "x", "f line 2")
    with pytest.raises(DatasetError, match="field 'entry_point' is 'not a name'"):
        problem_from_row({**ROW, "entry_point": "not a name"}, "x", "f line 3")
