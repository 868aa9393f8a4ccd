"""The number a completion answers with: the one extractor of the numeric tasks (gsm8k, arithmetic).

A `NumberReader` takes the last match of the first answer marker that matches ('#### N',
'\\boxed{N}', 'the answer is N' ...), else the text's last number. A task gives its number grammar
and its markers, most specific first, and turns the text read into its value.
"""

from __future__ import annotations

import re

# a number is never read out of a word or a decimal's fraction: "x2", "v3.1"
_STANDALONE = r"(?<![\w.])"


class NumberReader:
    """Reads a completion's answer as the text of a number (None when it has none)."""

    def __init__(self, number: str, *markers: str) -> None:
        """`number`: the grammar of one number (a regex without groups); `markers`: patterns
        around `{number}`, most specific first (a marker's own flags inline: `(?i:answer)`)."""
        self._markers = [re.compile(m.replace("{number}", f"({number})")) for m in markers]
        self._anywhere = re.compile(f"{_STANDALONE}({number})")

    def read(self, text: str) -> str | None:
        for pattern in self._markers:
            if found := pattern.findall(text):
                return str(found[-1])
        found = self._anywhere.findall(text)
        return str(found[-1]) if found else None
