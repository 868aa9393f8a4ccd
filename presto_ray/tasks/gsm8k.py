"""GSM8K: the final number. Rows: `question`, `answer` ending in a `#### N` line (the reference).

A completion's number is the one of its last `#### N` line, else its last number; thousands
separators are ignored (1,234 is 1234), and numbers compare by value (18.00 is 18).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from presto_ray.tasks.base import CORRECT, NO_ANSWER, WRONG, DatasetError, Grade, Problem, text_field
from presto_ray.tasks.numbers import NumberReader

NAME = "gsm8k"
INSTRUCTION = "Solve the problem step by step, then give the final answer on its own line as '#### <number>'."
# money signs and leading-dot decimals are numbers here (the arithmetic task's grammar has neither);
# a space may follow the money sign only: "10 - 5" ends in 5, a subtraction, not in -5
_NUMBER = r"-?(?:\$\s?)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+"
_READER = NumberReader(_NUMBER, r"####\s*{number}")


def _value(text: str) -> Decimal | None:
    try:
        return Decimal(text.replace(",", "").replace("$", "").replace(" ", ""))
    except InvalidOperation:
        return None


def final_number(text: str) -> str | None:
    """The number a text answers with: the last `#### N`, else the last number; None if none.
    Returned normalised (no separators, no trailing zeros: '1,234.50' -> '1234.5')."""
    found = _READER.read(text)
    if found is None:
        return None
    value = _value(found)
    if value is None:
        return None
    normal = format(value.normalize(), "f")
    return "0" if normal in ("-0", "") else normal


def problem_from_row(row: dict, problem_id: str, where: str) -> Problem:
    question = text_field(row, "question", where)
    answer = row.get("answer")
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    text = text_field({"answer": answer}, "answer", where)
    assert question is not None and text is not None
    if "####" in text:
        reference = final_number(text[text.rindex("####") :])
    else:
        reference = final_number(text) if re.fullmatch(r"\s*" + _NUMBER + r"\s*", text) else None
    if reference is None:
        raise DatasetError(f"{where}: field 'answer' must end with '#### <number>' (or be a number)")
    return Problem(problem_id, NAME, f"{question}\n{INSTRUCTION}", reference, {"question": question, "level": row.get("level")})


def grade(problem: Problem, completion: str) -> Grade:
    number = final_number(completion)
    if number is None:
        return Grade(False, NO_ANSWER, None, "no number")
    right = Decimal(number) == Decimal(problem.reference)
    return Grade(right, CORRECT if right else WRONG, number)
