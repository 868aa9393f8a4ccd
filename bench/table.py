"""The benchmark reports' tables: rows of figures formatted by column, drawn by the library's one
table (presto_ray/table.py: Markdown, as docs/benchmarks.md shows them)."""

from __future__ import annotations

from presto_ray.table import format_table as draw_table

# (row key, table header, cell format), in the table's column order.
Columns = list[tuple[str, str, str]]


def format_table(rows: list[dict], columns: Columns) -> str:
    """The rows' figures, each formatted by its column, as one table."""
    headers = [header for _, header, _ in columns]
    return draw_table(headers, [[fmt.format(row[key]) for key, _, fmt in columns] for row in rows])
