"""HumanEval: run the task's tests on a completion, in a sandboxed subprocess.

Rows: `task_id`, `prompt` (the signature and docstring), `test` (defining `check(candidate)`),
`entry_point`. The program is HumanEval's: `prompt + completion + test + check(entry_point)`
when the completion continues the prompt; when it holds a whole definition of `entry_point`
(chat models answer so, often in a ``` fence), the fence's code follows the prompt instead (the
prompt's imports and helpers stay, the new definition replaces the stub).

The programs run in the code sandbox (presto_ray/tasks/sandbox.py: what a pass means, what
holds where).
"""

from __future__ import annotations

import re
import textwrap

from presto_ray.tasks.base import DatasetError, Grade, Problem, text_field
from presto_ray.tasks.sandbox import Limits, run_program

NAME = "humaneval"


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



def grade(problem: Problem, completion: str, limits: Limits = Limits()) -> Grade:
    return run_program(program(problem, completion), limits)
