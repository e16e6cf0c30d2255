"""Synthetic workloads: phases of identical requests at fixed intervals, merged in time."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from filledfirst.schedule import as_schedule, write_schedule


def synthetic_schedule(spec: dict) -> pl.DataFrame:
    """`count` requests per phase at start_s, start_s + interval_s, ...; ties in time keep
    the phases' order (then each phase's own order), so the result is deterministic."""
    parts = []
    for order, phase in enumerate(spec["phases"]):
        count = int(phase["count"])
        start = float(phase.get("start_s", 0.0))
        interval = float(phase.get("interval_s", 0.0))
        parts.append(
            pl.DataFrame(
                {
                    # start + k*interval rather than a running sum, so no error accumulates.
                    "t_offset_s": [start + k * interval for k in range(count)],
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
