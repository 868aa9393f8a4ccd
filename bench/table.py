"""Plain-text tables for the benchmark reports, shared by every bench module."""

from __future__ import annotations

# (row key, table header, cell format), in the table's column order.
Columns = list[tuple[str, str, str]]


def format_table(rows: list[dict], columns: Columns) -> str:
    """An aligned plain-text table: first column left-aligned, the rest right-aligned."""
    headers = [header for _, header, _ in columns]
    body = [[fmt.format(row[key]) for key, _, fmt in columns] for row in rows]
    widths = [max(len(line[i]) for line in [headers, *body]) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, body)])
