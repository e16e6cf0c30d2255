"""The one way a schedule (SCHEDULE_SCHEMA) is typed, summarised and written."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from filledfirst.atomic import write_json, write_parquet
from filledfirst.rates import arrival_rate
from filledfirst.records import SCHEDULE_SCHEMA

SCHEDULE_POLARS_SCHEMA = pl.Schema(
    {
        "request_id": pl.Int64,
        "t_offset_s": pl.Float64,
        "prompt_tokens": pl.Int64,
        "output_tokens": pl.Int64,
        "role": pl.String,
    }
)


def as_schedule(df: pl.DataFrame) -> pl.DataFrame:
    """Exactly the schedule columns, in order and type, numbered 0..n-1 in row order."""
    return df.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("request_id")).select(
        pl.col(name).cast(dtype) for name, dtype in SCHEDULE_POLARS_SCHEMA.items()
    )


def stats_path(out: Path) -> Path:
    return Path(out).with_name(Path(out).name + ".stats.json")


def _spread(col: pl.Series) -> dict:
    # "nearest" keeps token percentiles whole numbers that actually occur.
    return {
        "p50": int(col.quantile(0.5, "nearest")),
        "p90": int(col.quantile(0.9, "nearest")),
        "max": int(col.max()),
    }


def schedule_stats(df: pl.DataFrame, duration_s: float | None = None) -> dict:
    """Size and shape of a schedule. `duration_s` is the span the arrivals are spread over
    (a trace window's length); it defaults to the last arrival's offset."""
    n = df.height
    if duration_s is None:
        duration_s = float(df["t_offset_s"].max()) if n else 0.0
        rate = arrival_rate(n, duration_s - float(df["t_offset_s"].min())) if n else None
    else:  # a window's count over its length
        rate = n / duration_s if duration_s > 0 else None
    return {
        "requests": n,
        "duration_s": duration_s,
        "mean_rate_per_s": rate,
        "prompt_tokens": _spread(df["prompt_tokens"]) if n else None,
        "output_tokens": _spread(df["output_tokens"]) if n else None,
        "roles": dict(sorted(df["role"].value_counts().iter_rows())) if n else {},
    }


def write_schedule(
    df: pl.DataFrame, out: Path, extra_stats: dict, duration_s: float | None = None
) -> dict:
    """Write the schedule parquet and `<out>.stats.json` beside it, each atomically."""
    table = as_schedule(df).to_arrow().cast(SCHEDULE_SCHEMA)
    stats = {**schedule_stats(df, duration_s), **extra_stats}
    write_parquet(table, out)
    write_json(stats, stats_path(out))
    return stats
