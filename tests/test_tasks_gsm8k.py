"""GSM8K: the final number ('#### N', else the last number), rows."""

from __future__ import annotations

import pytest

from presto_ray.tasks.base import DatasetError
from presto_ray.tasks.gsm8k import final_number, grade, problem_from_row


@pytest.mark.parametrize(
    "text, expected",
    [
        ("She pays 5 + 13 = 18 dollars.\n#### 18", "18"),
        ("#### 1,234", "1234"),
        ("so it costs $1,234.50 in total", "1234.5"),
        ("The answer is 18.00", "18"),
        ("12 eggs, minus 3, gives 9", "9"),
        ("#### 7\nthough some might say 8", "7"),  # the marked line wins over a later number
        ("#### -3", "-3"),
        ("#### -$3", "-3"),
        ("it costs $ 12", "12"),
        # a minus with a space after it is subtraction, not a sign: the number is 5, not -5
        ("the answer is 10 - 5", "5"),
        ("#### 10 - 5", "10"),
        ("she ends 3 short: 10 -5", "-5"),  # a sign touching its digits stays a sign
        ("no digits", None),
        ("", None),
    ],
)
def test_final_number(text, expected):
    assert final_number(text) == expected


def test_gsm8k_grades_and_rows():
    row = {"question": "Janet has 16 eggs and eats 3. How many are left?", "answer": "16 - 3 = <<16-3=13>>13\n#### 13"}
    problem = problem_from_row(row, "0", "f line 1")
    assert problem.reference == "13" and "####" in problem.prompt
    assert grade(problem, "16 - 3 = 13 eggs.\n#### 13").correct
    assert grade(problem, "So 13.0 eggs").correct
    wrong = grade(problem, "#### 12")
    assert not wrong.correct and wrong.status == "wrong" and wrong.extracted == "12"
    assert grade(problem, "I cannot tell.").status == "no_answer"
    assert problem_from_row({"question": "Q", "answer": "#### 1,000"}, "1", "w").reference == "1000"
    with pytest.raises(DatasetError, match="f line 2: field 'answer' must end with '#### <number>'"):
        problem_from_row({"question": "Q", "answer": "thirteen"}, "1", "f line 2")
