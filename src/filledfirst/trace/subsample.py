"""Turn an Azure-format trace (TIMESTAMP,ContextTokens,GeneratedTokens) into a schedule:
a time window, then every K-th request in it, with arrival gaps optionally rescaled.

Timestamps are parsed as text into integer nanoseconds, so the 2023 files' seven
fractional digits and the 2024 files' mixed `.ffffff+00:00` / `+00:00` forms are exact;
nothing is rounded until the final seconds column.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import NoReturn

import numpy as np
import polars as pl

from filledfirst.errors import UserError
from filledfirst.schedule import as_schedule, write_schedule

log = logging.getLogger(__name__)

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_NS_PER_S = 1_000_000_000
_SHOWN = 5  # bad rows named in one error message

_TIMESTAMP = (
    r"^(?P<date>\d{4}-\d{2}-\d{2})[ T](?P<h>\d{2}):(?P<m>\d{2}):(?P<s>\d{2})"
    r"(?:\.(?P<frac>\d{1,9}))?"
    r"(?:(?P<z>Z)|(?P<sign>[+-])(?P<oh>\d{2}):?(?P<om>\d{2}))?$"
)


class _Source:
    """Where rows came from, so errors can point at a line of the file."""

    def __init__(self, name: str, first_line: int, unit: str) -> None:
        self.name, self.first_line, self.unit = name, first_line, unit

    def fail(self, what: str, df: pl.DataFrame, bad: pl.Series, column: str) -> NoReturn:
        rows = df.filter(bad).head(_SHOWN)
        where = ", ".join(
            f"{self.unit} {i + self.first_line} ({v!r})" for i, v in rows.select("_row", column).iter_rows()
        )
        raise UserError(f"{self.name}: {int(bad.sum())} row(s) with {what}, e.g. {where}")


def read_trace(source: str | Path | pl.DataFrame) -> tuple[pl.DataFrame, _Source]:
    """Rows as `_row, t_ns, prompt, output` (Int64), in file order, validated."""
    if isinstance(source, pl.DataFrame):
        raw, src = source, _Source("trace frame", 0, "row")
    else:
        path = Path(source)
        src = _Source(str(path), 2, "line")  # line 1 is the header
        try:
            raw = pl.read_csv(path, infer_schema=False)
        except FileNotFoundError:
            raise UserError(f"trace file {path} does not exist") from None
        except pl.exceptions.NoDataError:
            raise UserError(f"trace file {path} is empty") from None
        except pl.exceptions.PolarsError as exc:
            raise UserError(f"cannot read trace file {path} as CSV: {exc}") from None
    missing = [c for c in COLUMNS if c not in raw.columns]
    if missing:
        raise UserError(
            f"{src.name}: missing column(s) {missing}; expected {list(COLUMNS)}, found {raw.columns}"
        )
    if raw.height == 0:
        raise UserError(f"{src.name}: no rows after the header")
    df = raw.select(COLUMNS).with_row_index("_row").with_columns(pl.col("_row").cast(pl.Int64))
    df = df.with_columns(
        _timestamp_ns(df, src),
        _tokens(df, "ContextTokens", src).alias("prompt"),
        _tokens(df, "GeneratedTokens", src).alias("output"),
    )
    return df.select("_row", "t_ns", "prompt", "output"), src


def _timestamp_ns(df: pl.DataFrame, src: _Source) -> pl.Series:
    col = df["TIMESTAMP"]
    if isinstance(col.dtype, pl.Datetime):  # a frame read elsewhere; naive means UTC here too
        return col.dt.epoch("ns").alias("t_ns")
    parts = col.cast(pl.String).str.strip_chars().str.extract_groups(_TIMESTAMP).struct.unnest()
    num = {k: parts[k].cast(pl.Int64, strict=False) for k in ("h", "m", "s", "oh", "om")}
    days = parts["date"].str.to_date("%Y-%m-%d", strict=False).cast(pl.Int32).cast(pl.Int64)
    frac_ns = parts["frac"].fill_null("").str.pad_end(9, "0").cast(pl.Int64)
    # A timestamp without a zone is taken as UTC, which is what the 2023 files mean.
    sign = parts["sign"].replace_strict({"+": 1, "-": -1}, default=0, return_dtype=pl.Int64)
    zone_s = sign * (num["oh"].fill_null(0) * 3600 + num["om"].fill_null(0) * 60)
    t_ns = (
        days * 86_400 * _NS_PER_S
        + num["h"] * 3600 * _NS_PER_S
        + num["m"] * 60 * _NS_PER_S
        + num["s"] * _NS_PER_S
        + frac_ns
        - zone_s * _NS_PER_S
    )
    bad = t_ns.is_null() | (num["h"] > 23) | (num["m"] > 59) | (num["s"] > 60)
    if bad.any():
        src.fail("an unreadable TIMESTAMP (want e.g. 2023-11-16 18:15:46.6805900)", df, bad.fill_null(True), "TIMESTAMP")
    return t_ns.alias("t_ns")


def _tokens(df: pl.DataFrame, column: str, src: _Source) -> pl.Series:
    col = df[column]
    values = (col.str.strip_chars() if col.dtype == pl.String else col).cast(pl.Int64, strict=False)
    bad = values.is_null() | (values < 0)
    if bad.any():
        src.fail(f"a {column} that is not a whole number >= 0", df, bad.fill_null(True), column)
    return values


def _check_params(start_offset_s, minutes, keep_every, phase, time_scale, max_model_len) -> None:
    problems = []
    if not (start_offset_s >= 0 and math.isfinite(start_offset_s)):
        problems.append(f"start_offset_s must be >= 0, got {start_offset_s}")
    if not (minutes > 0 and math.isfinite(minutes)):
        problems.append(f"minutes must be > 0, got {minutes}")
    if keep_every < 1:
        problems.append(f"keep_every must be >= 1, got {keep_every}")
    if phase < 0:
        problems.append(f"phase must be >= 0, got {phase}")
    if not (time_scale > 0 and math.isfinite(time_scale)):
        problems.append(f"time_scale must be > 0, got {time_scale}")
    if max_model_len is not None and max_model_len < 2:
        problems.append(f"max_model_len must be >= 2 (one prompt and one output token), got {max_model_len}")
    if problems:
        raise UserError("invalid subsample settings: " + "; ".join(problems))


def _fit_sizes(df: pl.DataFrame, max_model_len: int | None) -> tuple[pl.DataFrame, dict]:
    """At least one token each way (vLLM needs both); then prompt+output <= max_model_len,
    shrinking the prompt first, because the output length is what a decode-bound run measures."""
    counts = {
        "zero_prompt": int((df["prompt"] == 0).sum()),
        "zero_output": int((df["output"] == 0).sum()),
    }
    df = df.with_columns(pl.col("prompt").clip(lower_bound=1), pl.col("output").clip(lower_bound=1))
    if max_model_len is None:
        return df, {**counts, "clipped": 0}
    over = (df["prompt"] + df["output"]) > max_model_len
    prompt = pl.max_horizontal(pl.lit(1), pl.min_horizontal("prompt", max_model_len - pl.col("output")))
    df = df.with_columns(prompt.alias("prompt")).with_columns(
        pl.min_horizontal("output", max_model_len - pl.col("prompt")).alias("output")
    )
    return df, {**counts, "clipped": int(over.sum())}


def _offset_seconds(ns: pl.Series, time_scale: float) -> pl.Series:
    # numpy's division is IEEE's, correctly rounded: an offset of 13,049,843,000 ns becomes
    # exactly the float nearest 13.049843. (Polars turns division by an integer literal into
    # a multiplication by its reciprocal, which is off by one unit in the last place.)
    # The int64 -> float64 step is exact below 2**53 ns (104 days).
    seconds = np.true_divide(ns.to_numpy().astype(np.float64), 1e9)
    return pl.Series("t_offset_s", seconds * time_scale if time_scale != 1.0 else seconds)


def _subsample(
    source: str | Path | pl.DataFrame,
    *,
    start_offset_s: float = 0.0,
    minutes: float,
    keep_every: int = 1,
    phase: int = 0,
    time_scale: float = 1.0,
    max_model_len: int | None = None,
    role: str = "trace",
) -> tuple[pl.DataFrame, dict]:
    _check_params(start_offset_s, minutes, keep_every, phase, time_scale, max_model_len)
    df, src = read_trace(source)
    if not df["t_ns"].is_sorted():
        # Replay needs arrivals in time order; a stable sort keeps file order among ties.
        log.warning("%s: timestamps are not in order; sorting them (ties keep file order)", src.name)
        df = df.sort("t_ns", maintain_order=True)
    first_ns, last_ns = int(df["t_ns"][0]), int(df["t_ns"][-1])
    start_ns = first_ns + round(start_offset_s * _NS_PER_S)
    end_ns = start_ns + round(minutes * 60 * _NS_PER_S)
    span_s = (last_ns - first_ns) / _NS_PER_S
    if start_ns > last_ns:
        raise UserError(
            f"{src.name}: the window starts {start_offset_s} s after the first request, "
            f"but the trace spans only {span_s:.3f} s"
        )
    if end_ns > last_ns:
        log.warning(
            "%s: the window runs %.1f s past the last request",
            src.name, (end_ns - last_ns) / _NS_PER_S,
        )
    window = df.filter((pl.col("t_ns") >= start_ns) & (pl.col("t_ns") < end_ns))
    kept = window.gather_every(keep_every, offset=phase) if phase < window.height else window.clear()
    if kept.height == 0:
        raise UserError(
            f"{src.name}: no request kept: the window [{start_offset_s}, "
            f"{start_offset_s + minutes * 60}) s holds {window.height} request(s), phase {phase}, keep_every {keep_every}"
        )
    kept, fit = _fit_sizes(kept, max_model_len)
    schedule = as_schedule(
        kept.select(
            _offset_seconds(kept["t_ns"] - start_ns, time_scale),
            pl.col("prompt").alias("prompt_tokens"),
            pl.col("output").alias("output_tokens"),
            pl.lit(role, dtype=pl.String).alias("role"),
        )
    )
    info = {
        "source": src.name,
        "trace_requests": df.height,
        "trace_span_s": span_s,
        "window": {
            "start_offset_s": start_offset_s,
            "minutes": minutes,
            "requests": window.height,
        },
        "keep_every": keep_every,
        "phase": phase,
        "time_scale": time_scale,
        "max_model_len": max_model_len,
        **fit,
        # What the arrivals are spread over: the window, cut short where the trace ends.
        "duration_s": (min(end_ns, last_ns) - start_ns) / _NS_PER_S * time_scale,
    }
    return schedule, info


def subsample(source: str | Path | pl.DataFrame, **spec) -> pl.DataFrame:
    """The schedule (SCHEDULE_SCHEMA columns) for a CSV path or an already-read frame.

    `spec` takes _subsample's keywords (start_offset_s, minutes, keep_every, phase,
    time_scale, max_model_len, role).
    Window: [first + start_offset_s, first + start_offset_s + minutes*60), by timestamp.
    Kept: the window's rows phase, phase+K, ... in time order. t_offset_s is measured
    from the window's start (not from the first kept row) and multiplied by time_scale.
    """
    return _subsample(source, **spec)[0]


def subsample_to_parquet(csv: Path, out: Path, **spec) -> dict:
    """Write the schedule to `out` and its stats to `<out>.stats.json`; return the stats.

    `spec`: as for `subsample`."""
    schedule, info = _subsample(csv, **spec)
    duration_s = info.pop("duration_s")
    stats = write_schedule(schedule, out, info, duration_s=duration_s)
    log.info(
        "%s: %d requests over %.1f s (%d clipped) -> %s",
        info["source"], stats["requests"], duration_s, info["clipped"], out,
    )
    return stats
