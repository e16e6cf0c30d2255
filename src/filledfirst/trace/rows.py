"""Trace rows read, typed and checked: `_row, t_ns, prompt, output` (Int64), file order,
and `prefix_blocks` (List(Int64)) and `session` where the format has them
(filledfirst.trace.formats).

A bad row is one with an unreadable time, a prompt that is not a whole number >= 1,
an output that is not a whole number >= 0, prefix block ids that are not whole numbers,
or a time earlier than one above it.
By default any bad row is an error naming counts and the first lines; with
`skip_bad` those rows are dropped and counted by reason.

A zero output is not bad: the Azure traces record requests that generated nothing, and
they still arrive and still cost a prefill, so they are kept (vLLM is asked for one
token) and counted as `zero_output` later. A zero prompt cannot be a real request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from filledfirst.errors import UserError
from filledfirst.trace.formats import (
    OUTPUT,
    PREFIX,
    PROMPT,
    SESSION,
    TIME,
    Format,
    block_ids,
    read_text,
    select_columns,
)

_SHOWN = 5  # bad rows named in one error message


@dataclass
class Source:
    """Where rows came from, so errors can point at a line of the file.

    `first_line` may be a function: a slice cut from the middle of a big file learns its
    line number (by counting newlines before it) only when an error needs it."""

    name: str
    first_line: int | Callable[[], int]
    unit: str = "line"

    def line(self, row: int) -> int:
        if callable(self.first_line):
            self.first_line = self.first_line()
        return row + self.first_line


@dataclass
class Rows:
    df: pl.DataFrame  # _row, t_ns, prompt, output; good rows only
    source: Source
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> rows dropped

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())


_OUT_OF_ORDER = "out_of_order"


def check_rows(raw: pl.DataFrame, src: Source, fmt: Format, *, skip_bad: bool = False,
               check_order: bool = True) -> Rows:
    """`raw`: the format's columns as text under the canonical names (formats.read_text)."""
    columns = [c for c in (TIME, PROMPT, OUTPUT, PREFIX, SESSION) if c in raw.columns]
    # polars reads a blank line as a row of nulls; it is no row (numbered first, so the
    # line numbers of the rows after it stay right).
    text = (
        raw.select(columns)
        .with_row_index("_row")
        .with_columns(pl.col("_row").cast(pl.Int64))
        .filter(~pl.all_horizontal(pl.col(columns).is_null()))
    )
    if text.height == 0:
        raise UserError(f"{src.name}: no rows" + (" after the header" if src.first_line != 1 else ""))
    df = text.select(
        "_row",
        fmt.time_ns(text[TIME]),
        _whole(text[PROMPT]).alias("prompt"),
        _whole(text[OUTPUT]).alias("output"),
        *([block_ids(text[PREFIX])] if PREFIX in text.columns else []),
        *([pl.col(SESSION).cast(pl.String)] if SESSION in text.columns else []),
    )
    masks = {
        TIME: df["t_ns"].is_null(),
        PROMPT: df["prompt"].is_null() | (df["prompt"] < 1),
        OUTPUT: df["output"].is_null() | (df["output"] < 0),
        **({PREFIX: df[PREFIX].is_null()} if PREFIX in df.columns else {}),
    }
    # Each bad row counts once, under its first reason (a cut-off last line is bad in all
    # three columns but is one row).
    seen = pl.Series([False] * df.height)
    bad = {}
    for reason, mask in masks.items():
        mask = mask & ~seen
        if mask.any():
            bad[reason], seen = mask, seen | mask
    any_bad = pl.select(pl.any_horizontal(list(bad.values()))).to_series() if bad else None
    good = df.filter(~any_bad) if any_bad is not None else df
    if check_order and good.height > 1:
        # Earlier than the latest time above it: replay needs arrivals in time order.
        late = good["t_ns"] < good["t_ns"].cum_max().shift(1, fill_value=good["t_ns"][0])
        if late.any():
            bad[_OUT_OF_ORDER] = df["_row"].is_in(good.filter(late)["_row"].implode())
            good = good.filter(~late)
    if bad and not skip_bad:
        _fail(text, bad, src, fmt)
    skipped = {_REASON_KEY.get(k, k): int(m.sum()) for k, m in bad.items()}
    return Rows(good, src, skipped)


# How a reason is counted in a schedule's stats (`skipped_by_reason`), whatever the format.
_REASON_KEY = {TIME: "timestamp", PROMPT: "prompt", OUTPUT: "output", PREFIX: "prefix"}


def _whole(col: pl.Series) -> pl.Series:
    return (col.str.strip_chars() if col.dtype == pl.String else col).cast(pl.Int64, strict=False)


def _fail(text: pl.DataFrame, bad: dict[str, pl.Series], src: Source, fmt: Format) -> None:
    parts = []
    for reason, mask in bad.items():
        column = TIME if reason == _OUT_OF_ORDER else reason
        what = (f"a {fmt.file_columns[TIME]} earlier than a row above it (the trace must be in time order)"
                if reason == _OUT_OF_ORDER else fmt.describe(reason))
        rows = text.filter(mask).head(_SHOWN).select("_row", column).iter_rows()
        where = ", ".join(f"{src.unit} {src.line(i)} ({v!r})" for i, v in rows)
        parts.append(f"{int(mask.sum())} row(s) with {what}, e.g. {where}")
    raise UserError(f"{src.name}: " + "; ".join(parts) + " (pass --skip-bad to drop bad rows and count them)")


def read_trace(source: str | Path | pl.DataFrame, fmt: Format | None = None, *,
               skip_bad: bool = False) -> tuple[pl.DataFrame, Source]:
    """The whole trace, checked: rows as `_row, t_ns, prompt, output` (Int64), file order."""
    rows = read_rows(source, fmt, skip_bad=skip_bad)
    return rows.df, rows.source


def read_rows(source: str | Path | pl.DataFrame, fmt: Format | None = None, *, skip_bad: bool = False) -> Rows:
    """A file, or a frame with the format's own column names (Azure's by default)."""
    fmt = fmt or Format.of(None)
    if isinstance(source, pl.DataFrame):
        return check_rows(select_columns(source, fmt, "trace frame"), Source("trace frame", 0, "row"), fmt,
                          skip_bad=skip_bad)
    path = Path(source)
    return check_rows(read_text(path, fmt), Source(str(path), first_data_line(path, fmt)), fmt, skip_bad=skip_bad)


def first_data_line(path: Path, fmt: Format) -> int:
    """The file's line of row 0: a CSV's header is line 1, a JSONL file has none."""
    return 2 if fmt.file_type(path) == "csv" else 1
