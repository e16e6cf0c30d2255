"""One probe's workload: a workload's shape replayed at a given rate for `probe_s` seconds.

Synthetic shape (phases of identical requests, see workloads.synthetic): its rate is its
n requests over the span D its arrivals take, D = max over phases of start_s + count *
interval_s (so one phase of `count` requests `interval_s` apart runs at 1/interval_s). A
probe at rate r for P seconds keeps the shape and stretches time: every phase keeps its
share of the requests (count * r * P / n, rounded, at least one), its place in the probe
(start_s * P / D) and its arrival process with the mean gap scaled to interval_s * (n / D)
/ r. Each phase then ends where it ended in the shape, scaled to P; the probe offers r
requests per second over P seconds, up to the rounding of the counts.

Trace shape (a window of W seconds of a trace, every K-th request): its density is
`kept_per_s`, the requests the window keeps per second of trace time (`trace_kept_rate` of
its schedule's stats). A probe at rate r has time_scale kept_per_s / r, so P seconds of
arrivals are P / time_scale seconds of trace time, taken as k stretches (`probe_stretches`)
of P / k / time_scale trace seconds spread evenly over the window (stretch i from W * i / k)
and laid end to end (stretch i from P * i / k in the probe). A bursty window then offers
its bursts and its lulls at every rate, in its own proportions: replaying only the
window's first P / time_scale seconds would give every probe the same first burst. When
the stretches would meet or overlap (P / time_scale >= W), the probe is one stretch from
the window's start. A probe offers requests / P, which follows r over the window but not
exactly: its rows are the window's own, not a rate made up.

A probe's length: at least `probe_s`, at least `lifetimes` request lifetimes (the p90
of scheduled arrival to end) of the highest-rate probe that held so far, and long enough
for the fewest requests whose attainment interval can show the target (a slow rate needs
a long probe), at most `max_s`.
An open-loop probe shorter than its requests' life ends before the requests in flight
reach their steady state: nothing has finished when the last arrives, no cap fills, and
the probe holds a rate the server cannot sustain. The held probe nearest the knee is the
one whose lifetimes are closest to the next probe's; a broken probe's are inflated by its
queue. The first probe, with nothing measured, lasts `probe_s`: start well below the knee.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import msgspec
import polars as pl

from filledfirst.contracts.stats import ScheduleStats
from filledfirst.study import SyntheticWorkload, TraceWorkload
from filledfirst.trace.formats import Format
from filledfirst.trace.subsample import stretches_to_parquet, window_of
from filledfirst.workloads.synthetic import synthetic_schedule


def _check(rate: float, probe_s: float) -> None:
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"a probe's rate must be > 0, got {rate}")
    if not (math.isfinite(probe_s) and probe_s > 0):
        raise ValueError(f"a probe's duration must be > 0, got {probe_s}")


def probe_duration(probe_s: float, lifetimes: float, max_s: float,
                   done: Iterable[tuple[float, bool | None, float | None]], rate: float | None = None,
                   min_requests: int = 1) -> float:
    """Seconds of arrivals of the next probe (module docstring), after the probes `done`,
    each (rate, held, lifetime p90 s); at `rate`, long enough for `min_requests` requests
    (filledfirst.frontier.verdict.min_requests), within `max_s`."""
    held = [(r, life) for r, ok, life in done if ok and life is not None]
    length = probe_s if lifetimes <= 0 or not held else max(probe_s, lifetimes * max(held)[1])
    if rate is not None and min_requests > 1:
        length = max(length, min_requests / rate)
    return min(length, max(max_s, probe_s))


def shape_span_s(shape: SyntheticWorkload) -> float:
    """D: the seconds a synthetic shape's arrivals take (its phases' ends, last gap included)."""
    return max(p.start_s + p.count * float(p.interval_s) for p in shape.phases)


def shape_rate(shape: SyntheticWorkload) -> float:
    """A synthetic shape's mean arrival rate, requests/s; a ValueError for a shape that
    sends everything at once (no rate to scale)."""
    span = shape_span_s(shape)
    if span <= 0:
        raise ValueError(
            "the workload sends all its requests at once (no interval_s, no start_s): it has no rate to scale")
    return sum(p.count for p in shape.phases) / span


def synthetic_probe(shape: SyntheticWorkload, rate: float, probe_s: float) -> SyntheticWorkload:
    """The synthetic workload of one probe (module docstring)."""
    _check(rate, probe_s)
    n = sum(p.count for p in shape.phases)
    span = shape_span_s(shape)
    base_rate = shape_rate(shape)
    phases = [
        msgspec.structs.replace(
            p, count=max(1, round(p.count * rate * probe_s / n)), start_s=p.start_s * probe_s / span,
            interval_s=float(p.interval_s) * base_rate / rate)
        for p in shape.phases
    ]
    return msgspec.structs.replace(shape, phases=phases)


def synthetic_probe_schedule(shape: SyntheticWorkload, rate: float, probe_s: float) -> pl.DataFrame:
    """The schedule (SCHEDULE_SCHEMA columns) of one probe of a synthetic shape."""
    return synthetic_schedule(synthetic_probe(shape, rate, probe_s))


def trace_kept_rate(stats: ScheduleStats) -> float:
    """Requests a trace workload keeps per second of trace time, from its schedule's
    stats (`<schedule>.stats.json`: requests, duration_s, time_scale)."""
    requests = stats.requests or 0
    trace_s = float(stats.duration_s or 0.0) / float(stats.time_scale or 1.0)
    if requests <= 0 or trace_s <= 0:
        raise ValueError(f"the trace window keeps {requests} request(s) over {trace_s:g} s: no rate to scale")
    return requests / trace_s


def trace_time_scale(kept_per_s: float, rate: float) -> float:
    """The time_scale at which a trace window keeping `kept_per_s` requests per trace
    second offers `rate` requests per second."""
    _check(rate, 1.0)
    if not (math.isfinite(kept_per_s) and kept_per_s > 0):
        raise ValueError(f"kept_per_s must be > 0, got {kept_per_s}")
    return kept_per_s / rate


@dataclass(frozen=True, slots=True)
class TraceProbe:
    """One probe of a trace workload (module docstring)."""

    workload: TraceWorkload  # the shape at the probe's time_scale; minutes: the trace it spans
    starts_s: tuple[float, ...]  # each stretch's start, trace seconds from the window's start
    stretch_s: float  # each stretch's length, trace seconds

    def write(self, csv: Path, out: Path, max_model_len: int | None = None,
              fmt: Format | None = None) -> ScheduleStats:
        """Write the probe's schedule, cut from the trace `csv` (read in `fmt`), and its
        stats beside it."""
        return stretches_to_parquet(csv, out, starts_s=self.starts_s, stretch_s=self.stretch_s,
                                    **window_of(self.workload), time_scale=float(self.workload.time_scale),
                                    max_model_len=max_model_len, fmt=fmt)


def trace_probe(shape: TraceWorkload, kept_per_s: float, rate: float, probe_s: float,
                stretches: int) -> TraceProbe:
    """The stretches of one probe of a trace shape (module docstring)."""
    _check(rate, probe_s)
    if stretches < 1:
        raise ValueError(f"a probe takes at least one stretch, got {stretches}")
    scale = trace_time_scale(kept_per_s, rate)
    trace_s, window_s = probe_s / scale, shape.minutes * 60.0
    if stretches == 1 or trace_s >= window_s:
        return TraceProbe(msgspec.structs.replace(shape, time_scale=scale, minutes=trace_s / 60.0), (0.0,), trace_s)
    starts = tuple(window_s * i / stretches for i in range(stretches))
    return TraceProbe(msgspec.structs.replace(shape, time_scale=scale), starts, trace_s / stretches)


def offered_rate(stats: ScheduleStats, probe_s: float) -> float:
    """The rate a probe's schedule offers: its requests over its seconds of arrivals."""
    return (stats.requests or 0) / probe_s
