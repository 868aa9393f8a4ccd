"""What every task shares: a problem, a grade, a grader, and the error that names a bad row."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence


class DatasetError(ValueError):
    """A dataset or completions file that cannot be used; the message names the file, the row and the field."""


@dataclass(frozen=True)
class Problem:
    """One benchmark problem, whatever its task.

    `prompt` is what a model is asked (the task's instruction included); `presto-ray eval` builds
    its prompt from `fields["question"]` (the problem's text without the instruction) and the
    task's template in the YAML (eval_config.py), whose default gives `prompt` again. `reference`
    is the reference answer as text: a math answer's LaTeX, GSM8K's number, a multiple-choice
    letter ("" for code, which is graded by its tests). `fields` holds the task's own data
    (question; HumanEval: prompt, test, entry_point; mcq: the letters and options; a level where
    the dataset has one)."""

    id: str
    task: str
    prompt: str
    reference: str
    fields: dict[str, Any] = field(default_factory=dict, compare=False)


# the statuses a grade may have: the answer was read and is right / wrong, or nothing could be read;
# code adds failed (its tests raised), timeout (killed at the limit) and error (it could not run)
CORRECT, WRONG, NO_ANSWER = "correct", "wrong", "no_answer"
PASSED, FAILED, TIMEOUT, ERROR = "passed", "failed", "timeout", "error"


@dataclass(frozen=True)
class Grade:
    correct: bool
    status: str
    extracted: str | None = None  # what the grader read from the completion (None: nothing)
    detail: str = ""  # why, in a few words (code: the tail of the error)


@dataclass(frozen=True)
class Grader:
    """A task's grading rule, and whether many grades may run at once: only where each runs in its
    own subprocess (code). math-verify's timeouts need the main thread, so the others run in turn."""

    grade: Callable[[Problem, str], Grade]
    concurrent: bool = False

    def __call__(self, problem: Problem, completion: str) -> Grade:
        return self.grade(problem, completion)

    def grade_all(self, jobs: Sequence[tuple[Problem, str]]) -> list[Grade]:
        """Every (problem, completion) graded, in order."""
        if self.concurrent:
            with ThreadPoolExecutor() as pool:
                return list(pool.map(lambda job: self.grade(*job), jobs))
        return [self.grade(problem, completion) for problem, completion in jobs]


def text_field(row: dict, name: str, where: str, *, required: bool = True) -> str | None:
    """A non-empty string field of a row, or a DatasetError naming `where` and the field."""
    value = row.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise DatasetError(f"{where}: field '{name}' is missing or empty")
        return None
    if not isinstance(value, str):
        raise DatasetError(f"{where}: field '{name}' must be a string, not {type(value).__name__}")
    return value
