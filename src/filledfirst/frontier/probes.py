"""One probe's workload: a workload's shape replayed at a given rate for `probe_s` seconds.

Synthetic shape (phases of identical requests, see workloads.synthetic): its rate is its
n requests over the span D its arrivals take, D = max over phases of start_s + count *
interval_s (so one phase of `count` requests `interval_s` apart runs at 1/interval_s). A
probe at rate r for P seconds keeps the shape and stretches time: every phase keeps its
share of the requests (count * r * P / n, rounded, at least one), its place in the probe
(start_s * P / D) and its arrival process with the mean gap scaled to interval_s * (n / D)
/ r. Each phase then ends where it ended in the shape, scaled to P; the probe offers r
requests per second over P seconds, up to the rounding of the counts.

Trace shape (a window of a trace, every K-th request): its density is `kept_per_s`, the
requests the window keeps per second of trace time (`trace_kept_rate` of its schedule's
stats). A probe at rate r has time_scale kept_per_s / r, and a window of P / time_scale
seconds of trace time from the same start, so its arrivals last P seconds. The trace
around the window decides the probe's exact rate: the same density, not the same rows.

A probe's length: at least `probe_s`, and at least `lifetimes` request lifetimes (the p90
of scheduled arrival to end) of the highest-rate probe that held so far, at most `max_s`.
An open-loop probe shorter than its requests' life ends before the requests in flight
reach their steady state: nothing has finished when the last arrives, no cap fills, and
the probe holds a rate the server cannot sustain. The held probe nearest the knee is the
one whose lifetimes are closest to the next probe's; a broken probe's are inflated by its
queue. The first probe, with nothing measured, lasts `probe_s`: start well below the knee.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import msgspec
import polars as pl

from filledfirst.contracts.stats import ScheduleStats
from filledfirst.study import SyntheticWorkload, TraceWorkload
from filledfirst.workloads.synthetic import synthetic_schedule


def _check(rate: float, probe_s: float) -> None:
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"a probe's rate must be > 0, got {rate}")
    if not (math.isfinite(probe_s) and probe_s > 0):
        raise ValueError(f"a probe's duration must be > 0, got {probe_s}")


def probe_duration(probe_s: float, lifetimes: float, max_s: float,
                   done: Iterable[tuple[float, bool | None, float | None]]) -> float:
    """Seconds of arrivals of the next probe (module docstring), after the probes `done`,
    each (rate, held, lifetime p90 s)."""
    held = [(rate, life) for rate, ok, life in done if ok and life is not None]
    if lifetimes <= 0 or not held:
        return probe_s
    return min(max(probe_s, lifetimes * max(held)[1]), max(max_s, probe_s))


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


def trace_probe(shape: TraceWorkload, kept_per_s: float, rate: float, probe_s: float) -> TraceWorkload:
    """The trace workload of one probe: same trace, start and subsampling; the
    time_scale for `rate`, and a window whose scaled length is `probe_s`."""
    _check(rate, probe_s)
    scale = trace_time_scale(kept_per_s, rate)
    return msgspec.structs.replace(shape, time_scale=scale, minutes=probe_s / scale / 60.0)
