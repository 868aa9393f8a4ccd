"""The generated `arithmetic` task of `presto-ray eval`: word problems with exact answers, from a seed.

Three graded levels:

- level 1: one addition or subtraction of numbers below 20;
- level 2: two operations (add, subtract) on numbers below 50;
- level 3: a multiplication, then an addition or subtraction (numbers below 12 and 30).

Every answer is a non-negative integer; a completion's answer is its final integer
(`extract_answer`). `gsm8k_rows` writes the problems as a GSM8K file (`presto-ray eval
--export-gsm8k FILE`), so the same problems can be run through the dataset path, its template and
its grader.
"""

from __future__ import annotations

import random

from presto_ray.tasks.base import CORRECT, NO_ANSWER, WRONG, Grade, Problem
from presto_ray.tasks.numbers import NumberReader

NAME = "arithmetic"
TASKS = (NAME,)  # the generated tasks
LEVELS = (1, 2, 3)
INSTRUCTION = "Answer with the final number."

_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo", "Kai", "Lena")
_ITEMS = ("apples", "marbles", "stickers", "books", "pencils", "cookies", "coins", "stamps", "shells", "cards")


def _level1(rng: random.Random, name: str, item: str) -> tuple[str, int]:
    a, b = rng.randint(2, 19), rng.randint(1, 19)
    if rng.random() < 0.5:
        return f"{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have now?", a + b
    a, b = max(a, b), min(a, b)
    return f"{name} has {a} {item} and gives away {b}. How many {item} does {name} have left?", a - b


def _level2(rng: random.Random, name: str, item: str) -> tuple[str, int]:
    a, b = rng.randint(10, 49), rng.randint(2, 49)
    c = rng.randint(1, a + b - 1)
    return (
        f"{name} has {a} {item}, buys {b} more and then gives {c} to a friend. "
        f"How many {item} does {name} have now?",
        a + b - c,
    )


def _level3(rng: random.Random, name: str, item: str) -> tuple[str, int]:
    boxes, per_box = rng.randint(2, 11), rng.randint(2, 11)
    extra = rng.randint(1, 29)
    if rng.random() < 0.5:
        return (
            f"{name} has {boxes} boxes with {per_box} {item} in each box, and {extra} loose {item}. "
            f"How many {item} does {name} have in total?",
            boxes * per_box + extra,
        )
    extra = min(extra, boxes * per_box - 1)
    return (
        f"{name} has {boxes} boxes with {per_box} {item} in each box and gives away {extra} {item}. "
        f"How many {item} does {name} have left?",
        boxes * per_box - extra,
    )


_BUILDERS = {1: _level1, 2: _level2, 3: _level3}


def arithmetic_problems(n: int, seed: int = 0) -> list[Problem]:
    """`n` problems, levels 1, 2, 3 in turn; the same (n, seed) always gives the same problems,
    and the first k of n problems are the k problems of `arithmetic_problems(k, seed)`. A
    problem's `prompt` is the word problem and the instruction, its `reference` the answer,
    `fields` the word problem alone (`question`) and the `level`."""
    if n < 1:
        raise ValueError("n must be at least 1")
    problems = []
    for i in range(n):
        rng = random.Random(f"arithmetic:{seed}:{i}")  # one stream per problem: prefixes are stable
        level = LEVELS[i % len(LEVELS)]
        question, answer = _BUILDERS[level](rng, rng.choice(_NAMES), rng.choice(_ITEMS))
        problems.append(Problem(f"arith-{seed}-{i}", NAME, f"{question} {INSTRUCTION}", str(answer),
                                {"question": question, "level": level}))  # fmt: skip
    return problems


def build_task(task: str, n: int, seed: int = 0) -> list[Problem]:
    if task == NAME:
        return arithmetic_problems(n, seed)
    raise ValueError(f"unknown task {task!r}; known: {', '.join(TASKS)}")


def gsm8k_rows(problems: list[Problem]) -> list[dict]:
    """The problems as GSM8K rows: `id`, `question` (without the instruction), `answer` '#### N', `level`."""
    return [{"id": p.id, "question": p.fields["question"], "answer": f"#### {p.reference}", "level": p.fields["level"]}
            for p in problems]  # fmt: skip


# no money signs or leading-dot decimals (the gsm8k grammar reads those); explicit answers first
_READER = NumberReader(
    r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?",
    r"\\boxed\{\s*{number}\s*\}",
    r"####\s*{number}",
    r"(?i:answer\s*(?:is|:|=)?\s*:?\s*\**\s*\$?){number}",
)


def extract_answer(text: str) -> int | None:
    """The integer the text answers with: after an explicit marker (\\boxed{..}, '####',
    'answer is ..'), else the last number in the text; None when there is none or it is not an
    integer. Thousands separators are read ('1,234' is 1234); '12.0' is 12; '12.5' is None."""
    found = _READER.read(text)
    if found is None:
        return None
    value = float(found.replace(",", ""))
    return int(value) if value.is_integer() else None


def grade(problem: Problem, completion: str) -> Grade:
    """An arithmetic problem's grade: `extract_answer` against the integer reference."""
    number = extract_answer(completion)
    if number is None:
        return Grade(False, NO_ANSWER, None, "no integer answer")
    right = str(number) == problem.reference
    return Grade(right, CORRECT if right else WRONG, str(number))
