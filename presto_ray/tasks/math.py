"""MATH and MATH500: the last `\\boxed{}` of a completion against the reference, by math-verify.

Rows: `problem`, and `answer` (the reference) or a `solution` whose last `\\boxed{}` is the
reference. math-verify (Hugging Face's grader: LaTeX and plain expressions parsed to sympy, then
compared numerically and symbolically) is imported lazily, on the first grade.
"""

from __future__ import annotations

import re
import threading

from presto_ray.tasks.base import CORRECT, NO_ANSWER, WRONG, DatasetError, Grade, Problem, text_field

NAME = "math"
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`, or `\\boxed 5`) of `text`, braces
    balanced; None when there is none (or its braces never close)."""
    found = None
    for match in _BOXED.finditer(text):
        start = match.end()
        if start < len(text) and text[start] == "{":
            depth = 0
            for i in range(start, len(text)):
                if text[i] == "{":
                    depth += 1
                elif text[i] == "}":
                    depth -= 1
                    if depth == 0:
                        found = text[start + 1 : i]
                        break
        else:  # `\boxed 5`: one token
            token = re.match(r"[^\s$]+", text[start:])
            if token and match.group(0).endswith(" "):
                found = token.group(0)
    return found.strip() if found is not None else None


def problem_from_row(row: dict, problem_id: str, where: str) -> Problem:
    problem = text_field(row, "problem", where)
    assert problem is not None
    answer = row.get("answer")
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    reference = text_field({"answer": answer}, "answer", where, required=False)
    if reference is None:
        solution = text_field(row, "solution", where, required=False)
        if solution is None:
            raise DatasetError(f"{where}: needs field 'answer' or a 'solution' ending in \\boxed{{}}")
        reference = last_boxed(solution)
        if not reference:
            raise DatasetError(f"{where}: field 'solution' has no \\boxed{{}} answer (and there is no 'answer')")
    return Problem(problem_id, NAME, f"{problem}\n\n{INSTRUCTION}", reference.strip(), {"question": problem, "level": row.get("level"), "subject": row.get("subject")})


def equivalent(reference: str, answer: str) -> bool:
    """math-verify's verdict on two answers' LaTeX (reference first: the order matters to it)."""
    from math_verify import parse, verify  # type: ignore[import-untyped]

    # math-verify times itself out with signal.alarm, which only the main thread may use
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse(f"\\boxed{{{reference}}}", parsing_timeout=timeout)
    target = parse(f"\\boxed{{{answer}}}", parsing_timeout=timeout)
    if not gold or not target:
        return False
    return bool(verify(gold, target, timeout_seconds=timeout))


def grade(problem: Problem, completion: str) -> Grade:
    answer = last_boxed(completion)
    if not answer:
        return Grade(False, NO_ANSWER, None, "no \\boxed{} answer")
    right = equivalent(problem.reference, answer)
    return Grade(right, CORRECT if right else WRONG, answer)
