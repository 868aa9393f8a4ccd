"""Benchmark datasets and graders: MATH / MATH500, GSM8K, HumanEval and multiple choice (GPQA-style),
read from the user's files and graded by well-kept rules. Used by `presto-ray grade` (completions
made anywhere); a `Problem`'s `prompt` and `grade()` are what `presto-ray eval` needs to run its
methods on these datasets.

    base       Problem, Grade, DatasetError, the statuses
    datasets   reading JSONL / Parquet (paths or URIs), row ids, inferring the task, completions
    registry   the tasks by name (TASKS) and grade(problem, completion)
    math       the last \\boxed{} against the reference, by math-verify (imported lazily)
    gsm8k      the final number ('#### N', else the last number)
    code       HumanEval: the tests run in a sandboxed subprocess (limits, no network, no forks)
    mcq        the chosen letter
    report     accuracy, the unbiased pass@k, Wilson intervals, the report's JSON
"""

from presto_ray.tasks.base import DatasetError, Grade, Problem
from presto_ray.tasks.code import Limits
from presto_ray.tasks.datasets import Completion, Dataset, load_dataset, read_completions
from presto_ray.tasks.registry import TASKS, grade

__all__ = ["TASKS", "Completion", "DatasetError", "Dataset", "Grade", "Limits", "Problem", "grade", "load_dataset", "read_completions"]
