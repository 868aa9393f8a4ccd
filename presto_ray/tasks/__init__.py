"""Tasks and graders: the benchmarks MATH / MATH500, GSM8K, HumanEval and multiple choice
(GPQA-style), read from the user's files and graded by well-kept rules, and the generated
`arithmetic` task. Used by `presto-ray grade` (completions made anywhere); a `Problem`'s `prompt`
and its task's `Grader` are what `presto-ray eval` needs to run its methods.

    base        Problem, Grade, Grader, DatasetError, the statuses
    datasets    reading JSONL / Parquet (paths or URIs), row ids, inferring the task, completions
    registry    the tasks by name (TASKS), each task's grader, and grade(problem, completion)
    math        the last \\boxed{} against the reference, by math-verify (imported lazily)
    gsm8k       the final number ('#### N', else the last number)
    arithmetic  generated word problems with integer answers (eval's default task), the final integer
    numbers     the number a completion answers with (gsm8k's and arithmetic's one reader)
    code        HumanEval: the tests run in a sandboxed subprocess (limits, no network, no forks)
    mcq         the chosen letter
    report      accuracy, the unbiased pass@k, Wilson intervals, the report's JSON
"""

from presto_ray.tasks.base import DatasetError, Grade, Grader, Problem
from presto_ray.tasks.sandbox import Limits
from presto_ray.tasks.datasets import Completion, Dataset, load_dataset, read_completions
from presto_ray.tasks.registry import TASKS, grade, grader

__all__ = [
    "TASKS", "Completion", "DatasetError", "Dataset", "Grade", "Grader", "Limits", "Problem", "grade", "grader", "load_dataset",
    "read_completions",
]  # fmt: skip
