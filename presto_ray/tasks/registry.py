"""The tasks by name, what each row needs, and the one grading entry point."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from presto_ray.tasks import code, gsm8k, math, mcq
from presto_ray.tasks.base import Grade, Problem


@dataclass(frozen=True)
class TaskSpec:
    name: str
    needs: str  # the columns a row needs, for messages
    from_row: Callable[[dict, str, str], Problem]  # (row, problem id, where) -> Problem
    grade: Callable[[Problem, str], Grade]


TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec(math.NAME, "'problem' and 'answer' or a 'solution' with \\boxed{}", math.problem_from_row, math.grade),
        TaskSpec(gsm8k.NAME, "'question' and 'answer' ending in '#### N'", gsm8k.problem_from_row, gsm8k.grade),
        TaskSpec(code.NAME, "'prompt', 'test', 'entry_point' (and 'task_id')", code.problem_from_row, code.grade),
        TaskSpec(mcq.NAME, "'question', options ('choices', columns A-D, or lettered in the question), 'answer' letter",
                 mcq.problem_from_row, mcq.grade),
    )
}


def grade(problem: Problem, completion: str, limits: code.Limits = code.Limits()) -> Grade:
    """Grade one completion of `problem` by its task's grader (`limits`: code's sandbox)."""
    if problem.task == code.NAME:
        return code.grade(problem, completion, limits)
    return TASKS[problem.task].grade(problem, completion)
