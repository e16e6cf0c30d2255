"""Trace rows read, typed and checked: `_row, t_ns, prompt, output` (Int64), file order.

A bad row is one with an unreadable timestamp, a prompt that is not a whole number >= 1,
an output that is not a whole number >= 0, or a timestamp earlier than one above it.
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
from filledfirst.trace.timestamps import parse_ns

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
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


# reason -> what the error message says about it
_REASONS = {
    "timestamp": "an unreadable TIMESTAMP (want e.g. 2023-11-16 18:15:46.6805900)",
    "prompt": "a ContextTokens that is not a whole number >= 1",
    "output": "a GeneratedTokens that is not a whole number >= 0",
    "out_of_order": "a TIMESTAMP earlier than a row above it (the trace must be in time order)",
}
_SHOWN_COLUMN = {"timestamp": "TIMESTAMP", "prompt": "ContextTokens", "output": "GeneratedTokens",
                 "out_of_order": "TIMESTAMP"}


def read_csv(path: Path, data: bytes | None = None) -> pl.DataFrame:
    """All columns as text (so nothing is silently coerced); `data` replaces the file's bytes."""
    try:
        return pl.read_csv(data if data is not None else path, infer_schema=False)
    except FileNotFoundError:
        raise UserError(f"trace file {path} does not exist") from None
    except pl.exceptions.NoDataError:
        raise UserError(f"trace file {path} is empty") from None
    except pl.exceptions.PolarsError as exc:
        raise UserError(f"cannot read trace file {path} as CSV: {exc}") from None


def check_rows(raw: pl.DataFrame, src: Source, *, skip_bad: bool = False, check_order: bool = True) -> Rows:
    missing = [c for c in COLUMNS if c not in raw.columns]
    if missing:
        raise UserError(
            f"{src.name}: missing column(s) {missing}; expected {list(COLUMNS)}, found {raw.columns}"
        )
    # polars reads a blank line as a row of nulls; it is no row (numbered first, so the
    # line numbers of the rows after it stay right).
    text = (
        raw.select(COLUMNS)
        .with_row_index("_row")
        .with_columns(pl.col("_row").cast(pl.Int64))
        .filter(~pl.all_horizontal(pl.col(COLUMNS).is_null()))
    )
    if text.height == 0:
        raise UserError(f"{src.name}: no rows after the header")
    df = text.select(
        "_row",
        parse_ns(text["TIMESTAMP"]),
        _whole(text["ContextTokens"]).alias("prompt"),
        _whole(text["GeneratedTokens"]).alias("output"),
    )
    masks = {
        "timestamp": df["t_ns"].is_null(),
        "prompt": df["prompt"].is_null() | (df["prompt"] < 1),
        "output": df["output"].is_null() | (df["output"] < 0),
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
        # Earlier than the latest timestamp above it: replay needs arrivals in time order.
        late = good["t_ns"] < good["t_ns"].cum_max().shift(1, fill_value=good["t_ns"][0])
        if late.any():
            bad["out_of_order"] = df["_row"].is_in(good.filter(late)["_row"].implode())
            good = good.filter(~late)
    if bad and not skip_bad:
        _fail(text, bad, src)
    skipped = {k: int(m.sum()) for k, m in bad.items()}
    return Rows(good, src, skipped)


def _whole(col: pl.Series) -> pl.Series:
    return (col.str.strip_chars() if col.dtype == pl.String else col).cast(pl.Int64, strict=False)


def _fail(text: pl.DataFrame, bad: dict[str, pl.Series], src: Source) -> None:
    parts = []
    for reason, mask in bad.items():
        column = _SHOWN_COLUMN[reason]
        rows = text.filter(mask).head(_SHOWN).select("_row", column).iter_rows()
        where = ", ".join(f"{src.unit} {src.line(i)} ({v!r})" for i, v in rows)
        parts.append(f"{int(mask.sum())} row(s) with {_REASONS[reason]}, e.g. {where}")
    raise UserError(f"{src.name}: " + "; ".join(parts) + " (pass --skip-bad to drop bad rows and count them)")


def read_trace(source: str | Path | pl.DataFrame, *, skip_bad: bool = False) -> tuple[pl.DataFrame, Source]:
    """The whole trace, checked: rows as `_row, t_ns, prompt, output` (Int64), file order."""
    rows = read_rows(source, skip_bad=skip_bad)
    return rows.df, rows.source


def read_rows(source: str | Path | pl.DataFrame, *, skip_bad: bool = False) -> Rows:
    if isinstance(source, pl.DataFrame):
        return check_rows(source, Source("trace frame", 0, "row"), skip_bad=skip_bad)
    path = Path(source)
    return check_rows(read_csv(path), Source(str(path), 2), skip_bad=skip_bad)  # line 1: header
