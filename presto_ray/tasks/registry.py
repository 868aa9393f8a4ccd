"""The tasks by name: what each benchmark's rows need, how a row becomes a problem, and each task's
grader (the generated arithmetic task's too); `grade` is the one grading entry point."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

from presto_ray.tasks import arithmetic, code, gsm8k, math, mcq
from presto_ray.tasks.sandbox import Limits
from presto_ray.tasks.base import Grade, Grader, Problem

GraderFor = Callable[[Limits], Grader]  # the grader under the code sandbox's limits


def _plain(grade: Callable[[Problem, str], Grade]) -> GraderFor:
    """A grader that needs no limits and grades in turn."""
    return lambda _limits: Grader(grade)


def _sandboxed(limits: Limits) -> Grader:
    """Code runs each completion's tests in its own subprocess: many may run at once."""
    return Grader(partial(code.grade, limits=limits), concurrent=True)


@dataclass(frozen=True)
class TaskSpec:
    name: str
    needs: str  # the columns a row needs, for messages
    from_row: Callable[[dict, str, str], Problem]  # (row, problem id, where) -> Problem
    grader: GraderFor


# the benchmark tasks read from files (presto-ray grade, eval --dataset)
TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec(math.NAME, "'problem' and 'answer' or a 'solution' with \\boxed{}", math.problem_from_row, _plain(math.grade)),
        TaskSpec(gsm8k.NAME, "'question' and 'answer' ending in '#### N'", gsm8k.problem_from_row, _plain(gsm8k.grade)),
        TaskSpec(code.NAME, "'prompt', 'test', 'entry_point' (and 'task_id')", code.problem_from_row, _sandboxed),
        TaskSpec(mcq.NAME, "'question', options ('choices', columns A-D, or lettered in the question), 'answer' letter",
                 mcq.problem_from_row, _plain(mcq.grade)),
    )
}
# every task's grader: the benchmarks' and the generated ones'
GRADERS: dict[str, GraderFor] = {arithmetic.NAME: _plain(arithmetic.grade), **{n: s.grader for n, s in TASKS.items()}}


def grader(task: str, limits: Limits = Limits()) -> Grader:
    """The grader of `task` (`limits`: code's sandbox)."""
    return GRADERS[task](limits)


def grade(problem: Problem, completion: str, limits: Limits = Limits()) -> Grade:
    """Grade one completion of `problem` by its task's grader (`limits`: code's sandbox)."""
    return grader(problem.task, limits)(problem, completion)
