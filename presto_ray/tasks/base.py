"""What every benchmark task shares: a problem, a grade, and the error that names a bad row."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
