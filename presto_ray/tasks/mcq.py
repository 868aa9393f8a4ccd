"""Multiple choice (GPQA, MMLU-style rows): the chosen letter against the reference letter.

Rows: `question`; the options as a `choices` list (lettered A, B, ... in order), as columns `A`,
`B`, `C`, `D` (...), or already lettered in the question text ("A) ...", "(B) ...", "C. ...",
one per line); `answer` as a letter (or, with a `choices` list, its 0-based index).

A completion's letter is, in order: the last explicit answer ("Answer: C", "answer is (C)",
"**Answer:** C", `\\boxed{C}`), else the last parenthesised letter "(C)", else a standalone letter
ending the text ("... so C." ). Only letters of the problem's options count.
"""

from __future__ import annotations

import re
import string

from presto_ray.tasks.base import CORRECT, NO_ANSWER, WRONG, DatasetError, Grade, Problem, text_field

NAME = "mcq"
INSTRUCTION = "Answer with the letter of the correct option, as 'Answer: X'."
LETTERS = string.ascii_uppercase
_INLINE_OPTION = re.compile(r"^\s*\(?([A-Z])[).:]\s+\S", re.MULTILINE)


def inline_options(question: str) -> str:
    """The letters of options written in the question text, one per line ("A) ..."), if they run
    A, B, C, ... (at least two); else ''."""
    letters = "".join(m.group(1) for m in _INLINE_OPTION.finditer(question))
    run = ""
    for letter in letters:
        if letter == LETTERS[len(run)]:
            run += letter
        elif letter == "A":  # a new run (an earlier "A." was a sentence)
            run = "A"
    return run if len(run) >= 2 else ""


def option_columns(columns: list[str] | set[str]) -> str:
    """The letters A, B, ... that are columns, in a run from A (at least two); else ''."""
    run = ""
    while len(run) < len(LETTERS) and LETTERS[len(run)] in columns:
        run += LETTERS[len(run)]
    return run if len(run) >= 2 else ""


def problem_from_row(row: dict, problem_id: str, where: str) -> Problem:
    question = text_field(row, "question", where)
    assert question is not None
    choices = row.get("choices")
    if choices is not None:
        if not isinstance(choices, (list, tuple)) or len(choices) < 2 or len(choices) > len(LETTERS):
            raise DatasetError(f"{where}: field 'choices' must be a list of 2 to 26 options")
        options = [str(c) for c in choices]
        letters = LETTERS[: len(options)]
        prompt = question + "\n" + "\n".join(f"{letter}) {text}" for letter, text in zip(letters, options))
    elif letters := option_columns(set(row)):
        options = [str(row[letter]) for letter in letters]
        prompt = question + "\n" + "\n".join(f"{letter}) {text}" for letter, text in zip(letters, options))
    elif letters := inline_options(question):
        options, prompt = [], question
    else:
        raise DatasetError(
            f"{where}: no options: give a 'choices' list, columns A, B, C, D, or lettered lines in 'question'"
        )
    answer = row.get("answer")
    if isinstance(answer, int) and not isinstance(answer, bool) and choices is not None:
        if not 0 <= answer < len(letters):
            raise DatasetError(f"{where}: field 'answer' is index {answer}, but there are {len(letters)} choices")
        reference = letters[answer]
    else:
        text = text_field(row, "answer", where) if not isinstance(answer, int) else str(answer)
        assert text is not None
        letter = text.strip().strip("().").strip().upper()
        if letter not in letters or len(letter) != 1:
            raise DatasetError(f"{where}: field 'answer' is {answer!r}; expected one of the letters {', '.join(letters)}")
        reference = letter
    return Problem(problem_id, NAME, f"{prompt}\n\n{INSTRUCTION}", reference, {"question": prompt, "letters": letters, "options": options})


def chosen_letter(text: str, letters: str = "ABCD") -> str | None:
    """The letter a completion chooses among `letters`, or None (see the module's rules).
    Letters are capitals: "the answer is a number" chooses nothing."""
    valid = f"[{re.escape(letters)}]"
    explicit = (
        rf"(?i:answer)(?:\*\*)?(?:\s+(?i:is))?\s*[:=]?\s*(?:\*\*)?\s*(?:(?i:option)\s+)?\(?({valid})\)?(?!\w)",
        rf"\\boxed\{{\s*(?:\\text\{{)?\s*\(?({valid})\)?\s*\}}",
    )
    found = [m for pattern in explicit for m in re.finditer(pattern, text)]
    if found:
        return max(found, key=lambda m: m.start()).group(1)
    parenthesised = re.findall(rf"\(({valid})\)", text)
    if parenthesised:
        return parenthesised[-1]
    final = re.search(rf"(?:^|[\s*:(])({valid})[).:*]*\s*$", text)
    return final.group(1) if final else None


def grade(problem: Problem, completion: str) -> Grade:
    letter = chosen_letter(completion, problem.fields.get("letters", "ABCD"))
    if letter is None:
        return Grade(False, NO_ANSWER, None, "no letter chosen")
    right = letter == problem.reference
    return Grade(right, CORRECT if right else WRONG, letter)
