"""Synthetic workloads: phases of identical requests, each with its arrival process, merged in time."""

from __future__ import annotations

from pathlib import Path

import msgspec
import polars as pl

from filledfirst.contracts.stats import ScheduleStats
from filledfirst.errors import UserError
from filledfirst.schedule import as_schedule, write_schedule
from filledfirst.study import SyntheticWorkload
from filledfirst.workloads.arrivals import arrival_times


def _typed(spec: SyntheticWorkload | dict) -> SyntheticWorkload:
    """The workload's config entry, typed (its defaults: filledfirst.study)."""
    if isinstance(spec, SyntheticWorkload):
        return spec
    return msgspec.convert({"kind": "synthetic", **spec}, SyntheticWorkload)


def synthetic_schedule(spec: SyntheticWorkload | dict) -> pl.DataFrame:
    """`count` requests per phase from start_s, interval_s apart on average (see
    arrivals.py); ties in time keep the phases' order (then each phase's own order), so
    the result is deterministic. Each phase draws from its own seed (workload seed + phase
    index), so adding a phase does not move the others."""
    parts = []
    spec = _typed(spec)
    for order, phase in enumerate(spec.phases):
        if not isinstance(phase.interval_s, (int, float)):
            raise UserError(
                f"phase {order} ({phase.role}): interval_s is relative to the knee of {phase.interval_s.of}: "
                "resolve it first (filledfirst workload synth --knee SEARCH_JSON)")
        count = phase.count
        times = arrival_times(
            count, float(phase.start_s), float(phase.interval_s), phase.arrival, float(phase.cv), spec.seed + order,
        )
        parts.append(
            pl.DataFrame(
                {
                    "t_offset_s": times.tolist(),
                    "prompt_tokens": [phase.prompt_tokens] * count,
                    "output_tokens": [phase.output_tokens] * count,
                    "role": [phase.role] * count,
                    "_phase": [order] * count,
                    "_k": list(range(count)),
                },
                schema_overrides={"_phase": pl.Int64, "_k": pl.Int64},
            )
        )
    merged = pl.concat(parts).sort(["t_offset_s", "_phase", "_k"], maintain_order=True)
    return as_schedule(merged)


def write_synthetic_schedule(spec: SyntheticWorkload | dict, out: Path, extra_stats: dict | None = None
                             ) -> ScheduleStats:
    """The schedule and its `.stats.json` (with `extra_stats`, ScheduleStats fields: e.g.
    `relative`, what a relative rate resolved to); returns the stats."""
    spec = _typed(spec)
    return write_schedule(synthetic_schedule(spec), out,
                          {"source": "synthetic", "phases": len(spec.phases), **(extra_stats or {})})
