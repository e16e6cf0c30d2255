"""A config workload's schedule, with its rates placed relative to measured knees: what
`filledfirst workload synth` and `trace subsample --workload` write, and what a capacity
search writes for the experiments it hosts (filledfirst.config.hosted_experiments)."""

from __future__ import annotations

import logging
from pathlib import Path

from filledfirst.contracts.stats import ScheduleStats
from filledfirst.errors import UserError
from filledfirst.frontier.relative import KneeFile, relative_refs, resolve_synthetic, trace_scale_resolver
from filledfirst.study import Study, SyntheticWorkload, TraceWorkload, default_of
from filledfirst.trace.formats import Format
from filledfirst.trace.subsample import subsample_to_parquet, window_of
from filledfirst.workloads.synthetic import write_synthetic_schedule

log = logging.getLogger(__name__)


def write_synthetic(study: Study, name: str, out: Path, knees: dict[str, KneeFile]) -> ScheduleStats:
    """The schedule of synthetic workload `name` and its stats beside it."""
    wl = study.workloads[name]
    if not isinstance(wl, SyntheticWorkload):
        raise UserError(f"workloads.{name} is a trace workload: use `filledfirst trace subsample`")
    extra = {}
    if relative_refs(wl):
        wl, resolved = resolve_synthetic(wl, knees)
        extra["relative"] = resolved
        for r in resolved:
            log.info("workloads.%s.%s: %g x the knee of %s (%g req/s, %s) = %g req/s", name, r.key,
                     r.times, r.of, r.knee_rps, r.reason, r.rate_rps)
    return write_synthetic_schedule(wl, out, extra)


def trace_window(study: Study, name: str, knees: dict[str, KneeFile], skip_bad: bool = False) -> dict:
    """subsample_to_parquet's arguments for trace workload `name` of the config: the
    config is the one place its window comes from."""
    wl = study.workloads[name]
    if not isinstance(wl, TraceWorkload):
        raise UserError(f"workloads.{name} is synthetic: use `filledfirst workload synth`")
    if wl.rate is not None:
        relative = trace_scale_resolver(wl.rate.of, wl.rate.times, knees)
        time_scale = default_of(TraceWorkload, "time_scale")  # unused: the knee decides it
    else:
        if knees:
            raise UserError(f"workloads.{name}: its rate is not relative to a knee: drop --knee")
        relative, time_scale = None, float(wl.time_scale)
    if wl.trace not in study.traces:
        raise UserError(f"workloads.{name}: trace {wl.trace!r} is not in the traces catalog")
    return {**window_of(wl), "skip_bad": wl.skip_bad or skip_bad, "max_model_len": study.model.max_model_len,
            "time_scale": time_scale, "relative": relative, "fmt": Format.of(study.traces[wl.trace])}


def write_workload(study: Study, name: str, out: Path, knees: dict[str, KneeFile],
                   trace_csv: Path | None = None) -> ScheduleStats:
    """The schedule of workload `name` (a trace's read from `trace_csv`) and its stats."""
    wl = study.workloads[name]
    if isinstance(wl, SyntheticWorkload):
        return write_synthetic(study, name, out, knees)
    if trace_csv is None:
        raise UserError(f"workloads.{name} is a trace workload: its trace's CSV is needed")
    return subsample_to_parquet(trace_csv, out, role="trace", **trace_window(study, name, knees))
