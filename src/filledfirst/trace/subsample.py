"""Turn a trace (Azure's CSVs, Mooncake's JSONL, or a file of your own: formats.py) into
a schedule: a time window, then every K-th request in it, with arrival gaps optionally
rescaled, sizes optionally scaled down for a small engine, and its prefix blocks (where
the trace has them) kept with the ideal cache's hits (prefix.py).

Timestamps are parsed as text into integer nanoseconds (timestamps.py), so the 2023
files' seven fractional digits and the 2024 files' mixed `.ffffff+00:00` / `+00:00` forms
are exact; nothing is rounded until the final seconds column.

A file is not read whole: the window is found by bisecting byte offsets (window.py),
so a ten-minute window of a one-week trace costs about what it costs in a one-hour one.
When the file is not in order where the bisect looks, the whole file is read instead
(with a warning), and that read names the bad rows (rows.py). `scan="full"` forces it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import polars as pl

from filledfirst.contracts.stats import ScheduleStats, Window
from filledfirst.errors import UserError
from filledfirst.schedule import as_schedule, spread, write_schedule
from filledfirst.study import TraceWorkload
from filledfirst.trace import prefix
from filledfirst.trace.formats import PREFIX, Format, read_text
from filledfirst.trace.rows import Rows, Source, check_rows, read_rows, read_trace
from filledfirst.trace.timestamps import NS_PER_S as _NS_PER_S
from filledfirst.trace.timestamps import format_ns, parse_one
from filledfirst.trace.window import NotBisectable, open_sorted

__all__ = ["read_trace", "stretches_to_parquet", "subsample", "subsample_to_parquet"]

log = logging.getLogger(__name__)


def _check_params(start_offset_s, start, minutes, keep_every, phase, time_scale, max_model_len,
                  length_scale=1.0) -> None:
    problems = []
    if not (0 < length_scale <= 1 and math.isfinite(length_scale)):
        problems.append(f"length_scale must be > 0 and <= 1, got {length_scale}")
    if start is not None and start_offset_s:
        problems.append("give either start or start_offset_s, not both")
    if not (start_offset_s >= 0 and math.isfinite(start_offset_s)):
        problems.append(f"start_offset_s must be >= 0, got {start_offset_s}")
    if start is not None and parse_one(start) is None:
        problems.append(f"start {start!r} is not a timestamp like 2024-05-12 00:10:00+00:00")
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


@dataclass(frozen=True)
class _Spec:
    """Where the window is: `start` (a timestamp) wins over `start_offset_s` (from the first row)."""

    start_offset_s: float
    start: str | None
    minutes: float

    def bounds(self, first_ns: int, last_ns: int, name: str) -> tuple[int, int]:
        """[start_ns, end_ns) of the window; an error when it starts outside the trace."""
        if self.start is not None:
            start_ns = parse_one(self.start)
            if start_ns < first_ns:
                raise UserError(
                    f"{name}: the window start {self.start} is {(first_ns - start_ns) / _NS_PER_S:.3f} s "
                    f"before the first request ({format_ns(first_ns)})"
                )
        else:
            start_ns = first_ns + round(self.start_offset_s * _NS_PER_S)
        if start_ns > last_ns:
            raise UserError(
                f"{name}: the window starts {(start_ns - first_ns) / _NS_PER_S:.3f} s after the first "
                f"request, but the trace spans only {(last_ns - first_ns) / _NS_PER_S:.3f} s"
            )
        return start_ns, start_ns + round(self.minutes * 60 * _NS_PER_S)


@dataclass(frozen=True)
class _Window:
    rows: pl.DataFrame  # the window's good rows (_row, t_ns, prompt, output), in time order
    source: Source
    first_ns: int
    last_ns: int
    start_ns: int
    end_ns: int
    trace_requests: int | None  # known only when the whole file was read
    skipped: dict[str, int]  # reason -> rows dropped (in what was read)
    read: str  # "bisect" (header + the window's bytes) or "full"


@dataclass(frozen=True)
class _Stretches:
    """Stretch i is [window start + starts_s[i], + stretch_s) of trace time (stretches_to_parquet)."""

    starts_s: tuple[float, ...]
    stretch_s: float

    def __post_init__(self) -> None:
        s, length = self.starts_s, self.stretch_s
        if not (math.isfinite(length) and length > 0):
            raise UserError(f"a stretch must last > 0 s, got {length}")
        if not s or s[0] < 0 or any(b - a < length for a, b in zip(s, s[1:])):
            raise UserError(f"stretches of {length:g} s must start at >= 0 s, in order, without overlap: {list(s)}")

    @property
    def end_s(self) -> float:
        return self.starts_s[-1] + self.stretch_s

    @property
    def length_ns(self) -> int:
        return round(self.stretch_s * _NS_PER_S)

    def cut(self, w: _Window, kept: pl.DataFrame) -> tuple[pl.DataFrame, list[Window]]:
        """The kept rows inside the stretches, with `laid_ns`, their trace time with the
        stretches laid end to end from 0 (whole nanoseconds: arrivals stay in order), and
        each stretch as a window (its requests counted before keep_every)."""
        parts, taken = [], []
        for i, offset_s in enumerate(self.starts_s):
            a = w.start_ns + round(offset_s * _NS_PER_S)
            inside = (pl.col("t_ns") >= a) & (pl.col("t_ns") < a + self.length_ns)
            parts.append(kept.filter(inside).with_columns((pl.col("t_ns") - a + i * self.length_ns).alias("laid_ns")))
            taken.append(Window(start=format_ns(a), start_offset_s=(a - w.first_ns) / _NS_PER_S,
                                minutes=self.stretch_s / 60, requests=w.rows.filter(inside).height))
        return pl.concat(parts), taken


def _window_full(source: str | Path | pl.DataFrame, spec: _Spec, skip_bad: bool, fmt: Format) -> _Window:
    rows = read_rows(source, fmt, skip_bad=skip_bad)
    df = rows.df
    if df.height == 0:
        raise UserError(f"{rows.source.name}: no usable rows ({rows.skipped_total} skipped as bad)")
    first_ns, last_ns = int(df["t_ns"][0]), int(df["t_ns"][-1])
    start_ns, end_ns = spec.bounds(first_ns, last_ns, rows.source.name)
    window = df.filter((pl.col("t_ns") >= start_ns) & (pl.col("t_ns") < end_ns))
    return _Window(window, rows.source, first_ns, last_ns, start_ns, end_ns, df.height, rows.skipped, "full")


def _window_bisect(path: Path, spec: _Spec, skip_bad: bool, fmt: Format) -> _Window:
    fh, csv = open_sorted(path, fmt)
    with fh:
        start_ns, end_ns = spec.bounds(csv.first_ns, csv.last_ns, csv.name)
        a, b, data = csv.window_bytes(start_ns, end_ns)
        src = Source(csv.name, csv.line_counter(a))
        if a == b:  # an empty window: nothing for polars to read
            empty = {c: pl.Int64 for c in ("_row", "t_ns", "prompt", "output")}
            rows = Rows(pl.DataFrame(schema=empty | ({PREFIX: pl.List(pl.Int64)} if fmt.has_prefix else {})), src)
        else:
            # Order is checked here, not in check_rows: out of order means "read it all".
            rows = check_rows(read_text(path, fmt, data), src, fmt, skip_bad=skip_bad, check_order=False)
    t_ns = rows.df["t_ns"]
    if not t_ns.is_sorted():
        raise NotBisectable("the window's rows are not in time order")
    if rows.df.height and (t_ns[0] < start_ns or t_ns[-1] >= end_ns):
        raise NotBisectable("the window's rows reach outside it")
    return _Window(rows.df, src, csv.first_ns, csv.last_ns, start_ns, end_ns, None, rows.skipped, "bisect")


def _read_window(source: str | Path | pl.DataFrame, spec: _Spec, skip_bad: bool, scan: str,
                 fmt: Format) -> _Window:
    """`scan`: "auto" bisects a CSV and falls back to reading it whole; "full" always reads
    it whole (as it does a JSONL file, which is read whole anyway)."""
    if (scan == "auto" and not isinstance(source, pl.DataFrame) and Path(source).is_file()
            and fmt.file_type(source) == "csv"):
        try:
            return _window_bisect(Path(source), spec, skip_bad, fmt)
        except NotBisectable as exc:
            log.warning("%s: cannot bisect (%s); reading the whole file", source, exc)
    return _window_full(source, spec, skip_bad, fmt)


def _fit_sizes(df: pl.DataFrame, max_model_len: int | None) -> tuple[pl.DataFrame, dict]:
    """At least one output token (vLLM needs one; see rows.py on zero outputs); then
    prompt+output <= max_model_len, shrinking the prompt first, because the output length
    is what a decode-bound run measures."""
    counts = {"zero_output": int((df["output"] == 0).sum())}
    df = df.with_columns(pl.col("output").clip(lower_bound=1))
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
    start: str | None = None,
    minutes: float,
    keep_every: int = 1,
    phase: int = 0,
    time_scale: float = 1.0,
    max_model_len: int | None = None,
    role: str = "trace",
    skip_bad: bool = False,
    scan: str = "auto",
    relative: Callable[[int, float], tuple[float, dict]] | None = None,
    stretches: _Stretches | None = None,
    fmt: Format | None = None,
    length_scale: float = 1.0,
) -> tuple[pl.DataFrame, dict]:
    """`relative` instead of `time_scale`: (requests kept, trace seconds they span) -> the
    time scale and what it was resolved from (a time scale relative to a knee: the
    caller's resolver, filledfirst.frontier.relative.trace_scale_resolver). A ValueError
    it raises is the user's to fix, as is the window it was given. `stretches`: only
    those parts of the window, laid end to end (stretches_to_parquet), at `time_scale`."""
    _check_params(start_offset_s, start, minutes, keep_every, phase, 1.0 if relative else time_scale,
                  max_model_len, length_scale)
    fmt = fmt or Format.of(None)
    if stretches is not None:
        assert relative is None, "stretches take an absolute time_scale"
        minutes = max(minutes, stretches.end_s / 60)  # read from the window's start to the later end
    w = _read_window(source, _Spec(start_offset_s, start, minutes), skip_bad, scan, fmt)
    name = w.source.name
    if w.end_ns > w.last_ns:
        log.warning("%s: the window runs %.1f s past the last request", name, (w.end_ns - w.last_ns) / _NS_PER_S)
    window = w.rows
    kept = window.gather_every(keep_every, offset=phase) if phase < window.height else window.clear()
    where, held = f"the window [{format_ns(w.start_ns)}, {format_ns(w.end_ns)})", window.height
    taken = None
    if stretches is not None:
        kept, taken = stretches.cut(w, kept)
        where = f"{len(taken)} stretch(es) of {stretches.stretch_s:g} s of {where}"
        held = sum(t.requests for t in taken)
    if kept.height == 0:
        raise UserError(f"{name}: no request kept: {where} holds {held} request(s), phase {phase}, "
                        f"keep_every {keep_every}")
    sizes = ({"length_scale": length_scale, "trace_prompt_tokens": spread(kept["prompt"]),
              "trace_output_tokens": spread(kept["output"])} if length_scale != 1.0 else {})
    kept, fit = _fit_sizes(prefix.scale_lengths(kept, length_scale), max_model_len)
    kept, blocks = _prefix_blocks(kept, fmt, length_scale)
    resolved = None
    if relative is not None:
        trace_s = (min(w.end_ns, w.last_ns) - w.start_ns) / _NS_PER_S
        try:
            time_scale, resolved = relative(kept.height, trace_s)
        except ValueError as exc:
            raise UserError(f"{name}: {exc}") from None
    # What the arrivals are spread over: the window, cut short where the trace ends; or the stretches.
    spread_ns = min(w.end_ns, w.last_ns) - w.start_ns if taken is None else len(taken) * stretches.length_ns
    schedule = as_schedule(
        kept.select(
            _offset_seconds(kept["t_ns"] - w.start_ns if taken is None else kept["laid_ns"], time_scale),
            pl.col("prompt").alias("prompt_tokens"),
            pl.col("output").alias("output_tokens"),
            pl.lit(role, dtype=pl.String).alias("role"),
            *([PREFIX, "block_tokens", "ideal_cached_tokens"] if blocks else []),
        )
    )
    info = {
        "source": name,
        **({"format": fmt.name} if fmt.name != "azure" else {}),
        "read": w.read,
        "trace_requests": w.trace_requests,
        "trace_first": format_ns(w.first_ns),
        "trace_span_s": (w.last_ns - w.first_ns) / _NS_PER_S,
        "window": Window(start=format_ns(w.start_ns), start_offset_s=(w.start_ns - w.first_ns) / _NS_PER_S,
                         minutes=minutes, requests=window.height),
        "keep_every": keep_every,
        "phase": phase,
        "time_scale": time_scale,
        "max_model_len": max_model_len,
        # With read == "bisect" only the window was read, so only its bad rows are counted.
        "skipped": sum(w.skipped.values()),
        "skipped_by_reason": w.skipped,
        **fit,
        **sizes,
        **blocks,
        **({"relative": [resolved]} if resolved else {}),
        **({"stretches": taken} if taken is not None else {}),
        "duration_s": spread_ns / _NS_PER_S * time_scale,
    }
    return schedule, info


def _prefix_blocks(kept: pl.DataFrame, fmt: Format, length_scale: float) -> tuple[pl.DataFrame, dict]:
    """The prefix columns of a trace that has them (ids cut to what each prompt covers,
    the sent block size, the ideal cache's hits in arrival order), and their stats."""
    if not fmt.has_prefix:
        return kept, {}
    trace_block = fmt.columns.block_tokens
    block = prefix.scaled_block_tokens(trace_block, length_scale)
    kept = prefix.fit_blocks(kept, block)
    ideal = pl.Series("ideal_cached_tokens", prefix.ideal_cached_tokens(
        kept[PREFIX].to_list(), kept["prompt"].to_list(), block), pl.Int64)
    kept = kept.with_columns(ideal, pl.lit(block, pl.Int64).alias("block_tokens"))
    return kept, {"trace_block_tokens": trace_block, "block_tokens": block,
                  "ideal_hit_share": prefix.ideal_hit_share(ideal, kept["prompt"])}


def subsample(source: str | Path | pl.DataFrame, **spec) -> pl.DataFrame:
    """The schedule (SCHEDULE_SCHEMA columns) for a CSV path or an already-read frame.

    `spec` takes _subsample's keywords (start_offset_s or start, minutes, keep_every,
    phase, time_scale or relative, max_model_len, role, skip_bad).
    Window: [first + start_offset_s, first + start_offset_s + minutes*60), by timestamp,
    where first is the file's first row; or [start, start + minutes*60) for a timestamp.
    Kept: the window's rows phase, phase+K, ... in time order. t_offset_s is measured
    from the window's start (not from the first kept row) and multiplied by time_scale.
    """
    return _subsample(source, **spec)[0]


def window_of(workload: TraceWorkload) -> dict[str, Any]:
    """subsample's keywords for a trace workload's window and subsampling (not its
    time_scale, which its `rate` may make relative to a knee)."""
    where = {"start": workload.start} if workload.start is not None else {"start_offset_s": workload.start_offset_s}
    return {**where, "minutes": workload.minutes, "keep_every": workload.keep_every, "phase": workload.phase,
            "skip_bad": workload.skip_bad, "length_scale": workload.length_scale}


def subsample_to_parquet(csv: Path, out: Path, **spec) -> ScheduleStats:
    """Write the schedule to `out` and its stats to `<out>.stats.json`; return the stats.

    `spec`: as for `subsample`."""
    schedule, info = _subsample(csv, **spec)
    duration_s = info.pop("duration_s")
    stats = write_schedule(schedule, out, info, duration_s=duration_s)
    log.info(
        "%s: %d requests over %.1f s (%d clipped) -> %s",
        info["source"], stats.requests, duration_s, info["clipped"], out,
    )
    return stats


def stretches_to_parquet(csv: Path, out: Path, *, starts_s: Sequence[float], stretch_s: float,
                         **spec) -> ScheduleStats:
    """Write the schedule of stretches of a trace window laid end to end, and its stats
    (as subsample_to_parquet); return the stats.

    Stretch i is [window start + starts_s[i], + stretch_s) of trace time (starts in order,
    no overlap). The window's rows are read once, from its start to its end or the last
    stretch's end, whichever is later (`window` in the stats), and kept as the window's own
    schedule keeps them (every keep_every-th from phase, counted from the window's start):
    the stretches hold the window's own requests. Stretch i's arrivals are scaled by
    time_scale and begin at i x stretch_s x time_scale, so the schedule lasts
    len(starts_s) x stretch_s x time_scale seconds (its duration_s), its requests numbered
    in arrival order. The stats record each stretch as a window under `stretches`.
    `spec`: subsample's keywords, with an absolute time_scale."""
    return subsample_to_parquet(csv, out, stretches=_Stretches(tuple(map(float, starts_s)), stretch_s), **spec)
