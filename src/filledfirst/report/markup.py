"""The report's HTML kit: tables, paragraphs, headings and folded details, with every data
string escaped.

Cells are plain values; escaping happens here, at the one place text becomes HTML, so
a run's error message or description can never inject markup into the report.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

# nbconvert's lab theme right-aligns every cell with a selector more specific than ours
# (hence !important); the seed's tables read left to right.
_STYLE = """
table.ff-table { margin: 0.5em 0 1em 0; border-collapse: collapse; }
table.ff-table th, table.ff-table td { text-align: left !important; padding: 0.2em 0.8em 0.2em 0; }
table.ff-table caption { text-align: left; font-weight: bold; }
div.ff-chart { margin: 0.5em 0 1.5em 0; }
"""


def style_html() -> str:
    """Once per page: the report's few style rules."""
    return f"<style>{_STYLE}</style>"


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def html_table(
    headers: Sequence[str], rows: Iterable[Sequence[object]], *, caption: str | None = None
) -> str:
    """A plain table; the first column is a row header (signal or key names)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        first, *rest = row
        cells = f"<th scope='row'>{esc(first)}</th>" + "".join(f"<td>{esc(c)}</td>" for c in rest)
        body.append(f"<tr>{cells}</tr>")
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return (
        f"<table class='ff-table'>{cap}<thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )


Row = TypeVar("Row")
# A table's column: its header and its cell of one row (a typed record, or a dict of the data).
Column = tuple[str, Callable[[Row], object]]


def column_table(columns: Sequence[Column[Row]], rows: Iterable[Row]) -> str:
    """A line per row, a cell per column: adding a column is one more entry in `columns`."""
    return html_table([h for h, _ in columns], ([cell(r) for _, cell in columns] for r in rows))


def para(text: str) -> str:
    return f"<p>{esc(text)}</p>"


def heading(text: str, level: int = 3) -> str:
    return f"<h{level}>{esc(text)}</h{level}>"


def code_details(summary: str, text: str) -> str:
    """Long text (the server command line) folded away but present in the file."""
    return f"<details><summary>{esc(summary)}</summary><pre>{esc(text)}</pre></details>"


def details_html(summary: str, inner_html: str) -> str:
    """A long table folded away: `inner_html` is markup built here (escaped already)."""
    return f"<details><summary>{esc(summary)}</summary>{inner_html}</details>"
