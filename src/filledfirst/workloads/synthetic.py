"""Synthetic workloads: phases of identical requests, each with its arrival process, merged in time."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from filledfirst.schedule import as_schedule, write_schedule
from filledfirst.workloads.arrivals import arrival_times


def synthetic_schedule(spec: dict) -> pl.DataFrame:
    """`count` requests per phase from start_s, interval_s apart on average (see
    arrivals.py); ties in time keep the phases' order (then each phase's own order), so
    the result is deterministic. Each phase draws from its own seed (workload seed + phase
    index), so adding a phase does not move the others."""
    parts = []
    seed = int(spec.get("seed", 0))
    for order, phase in enumerate(spec["phases"]):
        count = int(phase["count"])
        times = arrival_times(
            count, float(phase.get("start_s", 0.0)), float(phase.get("interval_s", 0.0)),
            phase.get("arrival", "constant"), float(phase.get("cv", 1.0)), seed + order,
        )
        parts.append(
            pl.DataFrame(
                {
                    "t_offset_s": times.tolist(),
                    "prompt_tokens": [int(phase["prompt_tokens"])] * count,
                    "output_tokens": [int(phase["output_tokens"])] * count,
                    "role": [phase["role"]] * count,
                    "_phase": [order] * count,
                    "_k": list(range(count)),
                },
                schema_overrides={"_phase": pl.Int64, "_k": pl.Int64},
            )
        )
    merged = pl.concat(parts).sort(["t_offset_s", "_phase", "_k"], maintain_order=True)
    return as_schedule(merged)


def write_synthetic_schedule(spec: dict, out: Path) -> None:
    df = synthetic_schedule(spec)
    write_schedule(df, out, {"source": "synthetic", "phases": len(spec["phases"])})
