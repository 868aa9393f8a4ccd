"""Multiple choice: the chosen letter, the three ways of giving options, rows."""

from __future__ import annotations

import pytest

from presto_ray.tasks.base import DatasetError
from presto_ray.tasks.mcq import chosen_letter, grade, problem_from_row


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Answer: C", "C"),
        ("The correct answer is (B).", "B"),
        ("**Answer:** D", "D"),
        ("so \\boxed{A}", "A"),
        ("A is wrong and so is B. Answer: D", "D"),
        ("I think (B) fails, but (D) fits.", "D"),
        ("After all that, it must be C.", "C"),
        ("C", "C"),
        ("The answer is a number", None),  # a lower-case article is no choice
        ("Answer: E", None),  # not an option of A-D
        ("I am not sure.", None),
    ],
)
def test_chosen_letter(text, expected):
    assert chosen_letter(text) == expected


def test_options_as_a_list_columns_or_in_the_question():
    listed = problem_from_row({"question": "2+2?", "choices": ["3", "4", "5"], "answer": "B"}, "q1", "w")
    assert listed.reference == "B" and "B) 4" in listed.prompt and listed.fields["letters"] == "ABC"
    assert problem_from_row({"question": "Q", "choices": ["x", "y"], "answer": 1}, "q", "w").reference == "B"
    columns = problem_from_row({"question": "Q", "A": "a", "B": "b", "C": "c", "D": "d", "answer": "(d)"}, "q", "w")
    assert columns.reference == "D" and "D) d" in columns.prompt
    inline = problem_from_row({"question": "Which?\nA) one\nB) two\nC) three\nD) four", "answer": "C"}, "q", "w")
    assert inline.fields["letters"] == "ABCD" and inline.reference == "C"
    assert grade(inline, "It is three. Answer: C").correct
    assert not grade(inline, "Answer: A").correct and grade(inline, "hmm").status == "no_answer"
    assert grade(listed, "Answer: D").status == "no_answer"  # only A-C are options here


def test_bad_mcq_rows_name_the_row_and_field():
    with pytest.raises(DatasetError, match="f line 3: no options"):
        problem_from_row({"question": "Q", "answer": "A"}, "q", "f line 3")
    with pytest.raises(DatasetError, match="f line 4: field 'answer' is 'E'"):
        problem_from_row({"question": "Q", "choices": ["a", "b"], "answer": "E"}, "q", "f line 4")
    with pytest.raises(DatasetError, match="field 'answer' is index 5"):
        problem_from_row({"question": "Q", "choices": ["a", "b"], "answer": 5}, "q", "w")
