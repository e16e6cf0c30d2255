"""The one way a schedule (SCHEDULE_SCHEMA) is typed, summarised and written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from filledfirst.atomic import write_parquet
from filledfirst.contracts.records import SCHEDULE_SCHEMA, ScheduledRequest
from filledfirst.contracts.stats import ScheduleStats, Spread
from filledfirst.errors import UserError
from filledfirst.rates import arrival_rate

SCHEDULE_POLARS_SCHEMA = pl.Schema(
    {
        "request_id": pl.Int64,
        "t_offset_s": pl.Float64,
        "prompt_tokens": pl.Int64,
        "output_tokens": pl.Int64,
        "role": pl.String,
        "prefix_blocks": pl.List(pl.Int64),
        "block_tokens": pl.Int64,
        "ideal_cached_tokens": pl.Int64,
    }
)
# Columns a schedule may leave out (one without prefix structure), with the value they then hold.
OPTIONAL = {"prefix_blocks": [], "block_tokens": 0, "ideal_cached_tokens": 0}


# What each column may hold besides its type: (the test, what a value that fails it is).
_VALUES = {
    "t_offset_s": (pl.col("t_offset_s").is_finite() & (pl.col("t_offset_s") >= 0), "not a finite number >= 0"),
    "prompt_tokens": (pl.col("prompt_tokens") >= 1, "not a whole number >= 1"),
    "output_tokens": (pl.col("output_tokens") >= 1, "not a whole number >= 1"),
    "block_tokens": (pl.col("block_tokens") >= 0, "not a whole number >= 0"),
    "ideal_cached_tokens": ((pl.col("ideal_cached_tokens") >= 0)
                            & (pl.col("ideal_cached_tokens") <= pl.col("prompt_tokens")),
                            "not a whole number from 0 to the prompt's tokens"),
}
_KIND = {"request_id": "a whole number", "t_offset_s": "a number", "prompt_tokens": "a whole number",
         "output_tokens": "a whole number", "role": "a string", "prefix_blocks": "a list of whole numbers",
         "block_tokens": "a whole number", "ideal_cached_tokens": "a whole number"}


def _first_misfit(col: pl.Series, want: pl.DataType) -> int:
    """The row of a column of the wrong type to show: the first value that does not
    convert to `want` as it is (a word among numbers, 0.5 as an id), else the first."""
    cast = col.cast(want, strict=False)
    bad = cast.is_null() & col.is_not_null()
    if col.dtype.is_numeric() and want.is_numeric():
        bad = bad | (cast.cast(col.dtype, strict=False) != col).fill_null(False)
    rows = bad.arg_true()
    return int(rows[0]) if len(rows) else 0


def _type_fits(column: str, dtype: pl.DataType) -> bool:
    want = SCHEDULE_POLARS_SCHEMA[column]
    if want == pl.String:
        return dtype == pl.String
    if want == pl.Float64:  # an offset written as whole seconds is an offset too
        return dtype.is_numeric()
    if isinstance(want, pl.List):
        return isinstance(dtype, pl.List) and (dtype.inner.is_integer() or dtype.inner == pl.Null)
    return dtype.is_integer()


def with_optional(df: pl.DataFrame) -> pl.DataFrame:
    """The optional columns a schedule left out, filled with what they mean when absent."""
    return df.with_columns(pl.lit(value, SCHEDULE_POLARS_SCHEMA[c]).alias(c)
                           for c, value in OPTIONAL.items() if c not in df.columns)


def check_schedule(df: pl.DataFrame, where: str) -> None:
    """A schedule a replay can send as it is, or a UserError naming the column and the
    row (counted from 0) of the first value that does not fit: a wrong type, a missing
    value, an offset that is not a finite number >= 0 (NaN or negative were sent at
    once), a token count below 1, a request_id used twice (their records overwrote each
    other)."""
    df = with_optional(df)
    for column in SCHEDULE_POLARS_SCHEMA:
        if column not in df.columns:
            raise UserError(f"{where}: column {column} is missing (a schedule has {', '.join(SCHEDULE_POLARS_SCHEMA)})")
        dtype = df.schema[column]
        if not _type_fits(column, dtype):
            row = _first_misfit(df[column], SCHEDULE_POLARS_SCHEMA[column])
            raise UserError(f"{where}: column {column}, row {row}: {df[column][row]!r} is not {_KIND[column]} "
                            f"(the column holds {dtype} values)")
    checks = [(c, pl.col(c).is_not_null(), "missing") for c in SCHEDULE_POLARS_SCHEMA]
    checks += [(c, test, what) for c, (test, what) in _VALUES.items()]
    checks.append(("request_id", pl.col("request_id").is_first_distinct(), "a request_id used in an earlier row"))
    rows = df.with_row_index("_row")
    for column, test, what in checks:  # missing values first: the checks after them pass a null
        bad = rows.filter(~test.fill_null(True))
        if bad.height:
            first = bad.row(0, named=True)
            raise UserError(f"{where}: column {column}, row {first['_row']}: {first[column]!r} is {what}"
                            + (f" ({bad.height} rows like it)" if bad.height > 1 else ""))


def load_schedule(path: Path) -> list[ScheduledRequest]:
    """A schedule file's requests, checked (check_schedule) before anything uses them."""
    try:
        df = pl.read_parquet(path)
    except Exception as exc:  # not there, not Parquet: either way nothing can start
        raise UserError(f"{path}: not a readable schedule ({type(exc).__name__}: {exc})") from None
    check_schedule(df, str(path))
    df = with_optional(df).select(pl.col(name).cast(dtype) for name, dtype in SCHEDULE_POLARS_SCHEMA.items())
    return [ScheduledRequest(**row | {"prefix_blocks": tuple(row["prefix_blocks"])})
            for row in df.iter_rows(named=True)]


def as_schedule(df: pl.DataFrame) -> pl.DataFrame:
    """Exactly the schedule columns, in order and type, numbered 0..n-1 in row order."""
    return with_optional(df).with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("request_id")).select(
        pl.col(name).cast(dtype) for name, dtype in SCHEDULE_POLARS_SCHEMA.items()
    )


def spread(col: pl.Series) -> Spread:
    # "nearest" keeps token percentiles whole numbers that actually occur.
    return Spread(p50=int(col.quantile(0.5, "nearest")), p90=int(col.quantile(0.9, "nearest")), max=int(col.max()))


def schedule_stats(df: pl.DataFrame, duration_s: float | None = None) -> ScheduleStats:
    """Size and shape of a schedule. `duration_s` is the span the arrivals are spread over
    (a trace window's length); it defaults to the last arrival's offset."""
    n = df.height
    if duration_s is None:
        duration_s = float(df["t_offset_s"].max()) if n else 0.0
        rate = arrival_rate(n, duration_s - float(df["t_offset_s"].min())) if n else None
    else:  # a window's count over its length
        rate = n / duration_s if duration_s > 0 else None
    return ScheduleStats(
        requests=n,
        duration_s=duration_s,
        mean_rate_per_s=rate,
        prompt_tokens=spread(df["prompt_tokens"]) if n else None,
        output_tokens=spread(df["output_tokens"]) if n else None,
        roles=dict(sorted(df["role"].value_counts().iter_rows())) if n else {},
    )


def write_schedule(
    df: pl.DataFrame, out: Path, made_by: dict[str, Any], duration_s: float | None = None
) -> ScheduleStats:
    """Write the schedule parquet and `<out>.stats.json` beside it, each atomically; the
    stats are its size and shape and `made_by`, the ScheduleStats fields of what made it."""
    table = as_schedule(df).to_arrow().cast(SCHEDULE_SCHEMA)
    stats = msgspec.structs.replace(schedule_stats(df, duration_s), **made_by)
    write_parquet(table, out)
    stats.write(out)
    return stats
