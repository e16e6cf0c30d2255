"""Trace file formats: which column holds what, and how a row's text becomes numbers.

Every format is read the same way: each wanted column as text (a CSV cell, or a JSONL
line's value as JSON text: a number's digits, a list's brackets), renamed to the
canonical names below, then checked row by row (filledfirst.trace.rows), so a bad value
names its line whatever the file's kind. Times become integer nanoseconds exactly: an
ISO datetime (filledfirst.trace.timestamps), or a decimal number of s, ms, us or ns cut
at its point (no float rounding), since the epoch or since the trace's start alike.

`azure` and `mooncake` are built in; a user's own file is a `TraceColumns` mapping in
the trace's catalog entry (docs/traces.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec
import polars as pl

from filledfirst.errors import UserError
from filledfirst.study import Trace, TraceColumns
from filledfirst.trace.timestamps import NS_PER_S, parse_ns

# The canonical columns of a read trace, whatever the file calls them.
TIME, PROMPT, OUTPUT, PREFIX, SESSION = "time", "prompt", "output", "prefix_blocks", "session"

AZURE = TraceColumns(time="TIMESTAMP", prompt="ContextTokens", output="GeneratedTokens", time_unit="iso",
                     file_type="csv")
# Mooncake (FAST'25): ms from the trace's start, and the ids of each prompt's 512-token blocks.
MOONCAKE = TraceColumns(time="timestamp", prompt="input_length", output="output_length", time_unit="ms",
                        file_type="jsonl", prefix_blocks="hash_ids", block_tokens=512)
BUILT_IN = {"azure": AZURE, "mooncake": MOONCAKE}

UNIT_NS = {"s": NS_PER_S, "ms": 1_000_000, "us": 1_000, "ns": 1}
_DECIMAL = r"^\d+(?:\.\d*)?$"
_ID_SEPARATORS = r"[\s,;|]+"


@dataclass(frozen=True)
class Format:
    """One trace format: its columns (`TraceColumns`) and the name it was given by."""

    columns: TraceColumns
    name: str

    @classmethod
    def of(cls, fmt: str | TraceColumns | Trace | None) -> Format:
        """From a trace's catalog entry, its `format` value, or None (Azure's)."""
        if isinstance(fmt, Trace):
            # the catalog's file name tells CSV from JSONL: the local copy's may not
            # (the workflow keeps every trace as data/traces/<name>.csv)
            entry, fmt = fmt, cls.of(fmt.format)
            if fmt.columns.file_type is None:
                fmt = cls(msgspec.structs.replace(fmt.columns, file_type=fmt.file_type(entry.file)), fmt.name)
            return fmt
        if fmt is None:
            fmt = "azure"
        if isinstance(fmt, TraceColumns):
            if fmt.prefix_blocks is not None and fmt.block_tokens is None:
                raise UserError(f"trace format: prefix_blocks {fmt.prefix_blocks!r} needs block_tokens "
                                "(the tokens of one prefix block in the trace)")
            return cls(fmt, "columns")
        if fmt not in BUILT_IN:
            raise UserError(f"trace format {fmt!r} is not one of {sorted(BUILT_IN)} (or a column mapping)")
        return cls(BUILT_IN[fmt], fmt)

    @property
    def file_columns(self) -> dict[str, str]:
        """canonical name -> the file's column, for the columns this format reads."""
        c = self.columns
        named = {TIME: c.time, PROMPT: c.prompt, OUTPUT: c.output, PREFIX: c.prefix_blocks, SESSION: c.session}
        return {k: v for k, v in named.items() if v is not None}

    @property
    def has_prefix(self) -> bool:
        return self.columns.prefix_blocks is not None

    def file_type(self, path: Path | str) -> str:
        if self.columns.file_type is not None:
            return self.columns.file_type
        suffix = Path(path).suffix.lower()
        if suffix in (".jsonl", ".ndjson"):
            return "jsonl"
        if suffix in (".csv", ".txt", ""):
            return "csv"
        raise UserError(f"{path}: cannot tell CSV from JSONL by its suffix {suffix!r}: set file_type in its format")

    def describe(self, key: str) -> str:
        """What the error message says a bad value of canonical column `key` should be."""
        c, col = self.columns, self.file_columns[key]
        return {
            TIME: f"an unreadable {col} (want " + (
                "e.g. 2023-11-16 18:15:46.6805900)" if c.time_unit == "iso" else f"a number of {c.time_unit} >= 0)"),
            PROMPT: f"a {col} that is not a whole number >= 1",
            OUTPUT: f"a {col} that is not a whole number >= 0",
            PREFIX: f"a {col} that is not a list of whole numbers",
        }[key]

    def time_ns(self, text: pl.Series) -> pl.Series:
        """Int64 nanoseconds named `t_ns`, null where the text is no time of this unit."""
        unit = self.columns.time_unit
        if unit == "iso":
            return parse_ns(text)
        return pl.select(decimal_ns(pl.lit(text.cast(pl.String)), UNIT_NS[unit])).to_series().alias("t_ns")

    def one_time_ns(self, text: str) -> int | None:
        return self.time_ns(pl.Series([text], dtype=pl.String))[0]


def decimal_ns(col: pl.Expr, unit_ns: int) -> pl.Expr:
    """A decimal number of units as exact Int64 nanoseconds: the digits before the point
    times the unit, those after it cut to the unit's precision (no float rounding)."""
    text = col.str.strip_chars()
    whole = text.str.extract(r"^(\d+)", 1).cast(pl.Int64, strict=False)
    digits = len(str(unit_ns)) - 1  # the fraction's digits one unit holds in ns
    frac = text.str.extract(r"\.(\d*)$", 1).fill_null("")
    frac_ns = (frac.str.slice(0, digits).str.pad_end(digits, "0").cast(pl.Int64, strict=False)
               if digits else pl.lit(0, pl.Int64))
    return pl.when(text.str.contains(_DECIMAL)).then(whole * unit_ns + frac_ns)


def block_ids(text: pl.Series) -> pl.Series:
    """Prefix block ids as List(Int64): a JSON list (`[3, 4]`) or ids separated by spaces,
    commas, semicolons or bars; an empty or missing cell is no block. A list holding
    anything but whole numbers is null (a bad row)."""
    cleaned = text.cast(pl.String).fill_null("").str.strip_chars().str.strip_chars("[]").str.strip_chars()
    parts = cleaned.str.replace_all(_ID_SEPARATORS, " ").str.split(" ")
    ids = parts.list.eval(pl.element().filter(pl.element() != "").cast(pl.Int64, strict=False))
    bad = ids.list.eval(pl.element().is_null()).list.any()
    return pl.select(pl.when(~bad).then(ids)).to_series().alias(PREFIX)


def read_text(path: Path, fmt: Format, data: bytes | None = None) -> pl.DataFrame:
    """The format's columns of every row, as text, under the canonical names; `data`
    replaces the file's bytes (a window cut from it). A missing column is an error naming
    what the file has."""
    kind = fmt.file_type(path)
    try:
        if kind == "csv":
            raw = pl.read_csv(data if data is not None else path, infer_schema=False)
        else:
            raw = _jsonl_text(data if data is not None else path, fmt)
    except FileNotFoundError:
        raise UserError(f"trace file {path} does not exist") from None
    except pl.exceptions.NoDataError:
        raise UserError(f"trace file {path} is empty") from None
    except pl.exceptions.PolarsError as exc:
        raise UserError(f"cannot read trace file {path} as {kind.upper()}: {exc}") from None
    return select_columns(raw, fmt, str(path))


def select_columns(raw: pl.DataFrame, fmt: Format, name: str) -> pl.DataFrame:
    """The format's columns of an already-read frame, renamed to the canonical names."""
    wanted = fmt.file_columns
    missing = [col for col in wanted.values() if col not in raw.columns]
    if missing:
        raise UserError(f"{name}: missing column(s) {missing}; the {fmt.name} format reads "
                        f"{list(wanted.values())}, found {raw.columns}")
    return raw.select(pl.col(col).alias(key) for key, col in wanted.items())


_JSON_LINE = "\x00line"


def _jsonl_text(source: Path | bytes, fmt: Format) -> pl.DataFrame:
    """One row per line (a blank line stays a row of nulls, so line numbers hold), each
    wanted field as its JSON text; a line that is no JSON object gives nulls, a bad row."""
    lines = pl.read_csv(source, has_header=False, separator="\x1f", quote_char=None, infer_schema=False,
                        new_columns=[_JSON_LINE])
    line = pl.col(_JSON_LINE)
    fields = {col: line.str.json_path_match("$['" + col.replace("'", "\\'") + "']")
              for col in dict.fromkeys(fmt.file_columns.values())}
    # A line that is not blank but gives no time (not JSON, or no such key) shows itself
    # as its unreadable time, so its error quotes it and it is never taken for a blank line.
    time = fmt.columns.time
    fields[time] = pl.coalesce(fields[time], pl.when(line.str.strip_chars() != "").then(line.str.slice(0, 80)))
    return lines.select(expr.alias(col) for col, expr in fields.items())
