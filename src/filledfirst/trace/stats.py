"""Whole-trace figures (`filledfirst trace stats`), streamed so memory stays low.

The file is read once, in batches of 262,144 rows; what is kept is small: counts per
minute and a histogram of each token column (token counts are whole numbers below
~10^5, so a histogram is a few thousand rows and gives exact percentiles). A one-week
trace (27 M rows, over a GB) never sits in memory. Timestamps go through `fast_ns`
only: the rare spellings only the regex knows count as bad rows here.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import polars as pl

from filledfirst.contracts.stats import Spread, TraceStats
from filledfirst.errors import UserError
from filledfirst.rates import arrival_rate
from filledfirst.trace.formats import OUTPUT, PROMPT, TIME, UNIT_NS, Format, decimal_ns
from filledfirst.trace.timestamps import NS_PER_S, fast_ns, format_ns

log = logging.getLogger(__name__)
_NS_PER_MIN = 60 * NS_PER_S


def _scan(path: Path, fmt: Format) -> pl.LazyFrame:
    if not path.is_file():
        raise UserError(f"trace file {path} does not exist")
    cols = fmt.file_columns
    try:
        if fmt.file_type(path) == "csv":
            lf = pl.scan_csv(path, infer_schema=False)
            names = lf.collect_schema().names()
            missing = [c for c in cols.values() if c not in names]
            if missing:
                raise UserError(f"{path}: missing column(s) {missing}; the {fmt.name} format reads "
                                f"{list(cols.values())}, found {names}")
            text = {key: pl.col(col) for key, col in cols.items()}
        else:
            lf = pl.scan_csv(path, has_header=False, separator="\x1f", quote_char=None, infer_schema=False,
                             new_columns=["line"])
            text = {key: pl.col("line").str.json_path_match("$['" + col.replace("'", "\\'") + "']")
                    for key, col in cols.items()}
    except pl.exceptions.NoDataError:
        raise UserError(f"trace file {path} is empty") from None
    except pl.exceptions.PolarsError as exc:
        raise UserError(f"cannot read trace file {path}: {exc}") from None
    unit = fmt.columns.time_unit
    t_ns = fast_ns(text[TIME]) if unit == "iso" else decimal_ns(text[TIME], UNIT_NS[unit])
    whole = {c: text[c].str.strip_chars().cast(pl.Int64, strict=False) for c in (PROMPT, OUTPUT)}
    return lf.select(t_ns.alias("t_ns"), whole[PROMPT].alias("prompt"), whole[OUTPUT].alias("output"))


def _percentiles(hist: pl.DataFrame, column: str) -> Spread | None:
    """p50/p90 ("nearest", as schedule stats do), max and mean from a value histogram."""
    hist = hist.sort(column)
    n = int(hist["len"].sum())
    if n == 0:
        return None
    cum = hist["len"].cum_sum()

    def nearest(q: float) -> int:
        rank = math.floor(q * (n - 1) + 0.5)  # 0-based rank, rounded half up as polars does
        return int(hist[column][int(cum.search_sorted(rank + 1, side="left"))])

    mean = float((hist[column] * hist["len"]).sum()) / n
    return Spread(p50=nearest(0.5), p90=nearest(0.9), max=int(hist[column][-1]), mean=mean)


class _Tally:
    """Running totals over the batches of one pass; everything kept is small."""

    def __init__(self) -> None:
        self.rows = self.good = self.out_of_order = self.zero_output = 0
        self.first_ns: int | None = None
        self.last_ns: int | None = None  # of the previous good row, for the order check
        self.min_ns = self.max_ns = None
        self.per_min = np.zeros(0, dtype=np.int64)
        self.hist: dict[str, pl.DataFrame] = {}

    def add(self, batch: pl.DataFrame) -> None:
        self.rows += batch.height
        df = batch.filter(batch["good"])
        if df.height == 0:
            return
        t = df["t_ns"]
        if self.first_ns is None:
            self.first_ns = int(t[0])
        prev = self.last_ns if self.last_ns is not None else int(t[0])
        # Earlier than the row above: 0 means the file is sorted (and can be bisected).
        self.out_of_order += int((t < t.shift(1, fill_value=prev)).sum())
        self.last_ns = int(t[-1])
        self.good += df.height
        lo, hi = int(t.min()), int(t.max())
        self.min_ns = lo if self.min_ns is None else min(self.min_ns, lo)
        self.max_ns = hi if self.max_ns is None else max(self.max_ns, hi)
        self.zero_output += int((df["output"] == 0).sum())
        minute = ((t - self.first_ns) // _NS_PER_MIN).to_numpy()
        counts = np.bincount(minute[minute >= 0])  # rows before the first (unsorted) are left out
        if counts.size > self.per_min.size:
            self.per_min = np.pad(self.per_min, (0, counts.size - self.per_min.size))
        self.per_min[: counts.size] += counts
        for col in ("prompt", "output"):
            vc = df[col].value_counts(name="len")
            old = self.hist.get(col)
            self.hist[col] = vc if old is None else pl.concat([old, vc]).group_by(col).agg(pl.col("len").sum())


def trace_stats(path: Path, out: Path | None = None, fmt: Format | None = None) -> TraceStats:
    """Requests, span, mean rate, token percentiles and requests per minute of the whole
    file (Azure's format unless `fmt` says otherwise)."""
    path = Path(path)
    fmt = fmt or Format.of(None)
    good = (pl.col("t_ns").is_not_null() & (pl.col("prompt") >= 1) & (pl.col("output") >= 0)).fill_null(False)
    tally = _Tally()
    try:
        for batch in _scan(path, fmt).with_columns(good.alias("good")).collect_batches(chunk_size=1 << 18):
            tally.add(batch)
    except pl.exceptions.PolarsError as exc:
        raise UserError(f"cannot read trace file {path}: {exc}") from None
    if tally.good == 0:
        raise UserError(f"{path}: no usable rows (header only, or every row bad)")
    span_s = (tally.max_ns - tally.min_ns) / NS_PER_S
    stats = TraceStats(
        source=str(path),
        requests=tally.good,
        bad_rows=tally.rows - tally.good,
        first=format_ns(tally.first_ns),
        min=format_ns(tally.min_ns),
        max=format_ns(tally.max_ns),
        span_s=span_s,
        mean_rate_per_s=arrival_rate(tally.good, span_s),
        out_of_order=tally.out_of_order,
        zero_output=tally.zero_output,
        prompt_tokens=_percentiles(tally.hist["prompt"], "prompt"),
        output_tokens=_percentiles(tally.hist["output"], "output"),
        requests_per_minute=tally.per_min.tolist(),
    )
    if stats.bad_rows:
        log.warning("%s: %d bad row(s) left out (`trace subsample` names them)", path, stats.bad_rows)
    if out is not None:
        stats.write(out)
    return stats


def _about(x: float, digits: int) -> str:
    """`x` rounded to `digits` significant digits, with thousands separators."""
    if x == 0:
        return "0"
    shift = digits - 1 - math.floor(math.log10(abs(x)))
    return f"{round(x, shift):,.{max(shift, 0)}f}"


def summary_text(s: TraceStats) -> str:
    per_min = s.requests_per_minute
    lines = [
        f"{s.source}: {s.requests:,} requests over {s.span_s / 3600:,.1f} h "
        f"(from {s.first}), {_about(s.mean_rate_per_s or 0, 3)} per second on average",
    ]
    for label, p in (("prompt", s.prompt_tokens), ("output", s.output_tokens)):
        lines.append(
            f"median {label} about {_about(p.p50, 3)} tokens, p90 around {_about(p.p90, 2)}, "
            f"max {p.max:,}"
        )
    if per_min:
        lines.append(f"requests per minute: median {sorted(per_min)[len(per_min) // 2]:,}, busiest {max(per_min):,}")
    if s.bad_rows or s.out_of_order:
        lines.append(f"bad rows: {s.bad_rows:,}; rows earlier than the one above: {s.out_of_order:,}")
    return "\n".join(lines)
