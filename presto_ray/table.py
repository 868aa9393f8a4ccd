"""The one plain-text table of every report (validate, eval, the benchmarks): Markdown, aligned
for the terminal too, so a printed table pastes into the docs as it is."""

from __future__ import annotations

from typing import Sequence


def format_table(headers: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """A Markdown table of already formatted cells: the first column left-aligned, the rest right-aligned."""
    widths = [max(3, *(len(row[i]) for row in [headers, *body])) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    rule = "| " + " | ".join((":" + "-" * (w - 1)) if i == 0 else ("-" * (w - 1) + ":") for i, w in enumerate(widths)) + " |"
    return "\n".join([line(headers), rule, *map(line, body)])
