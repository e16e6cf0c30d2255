"""Synthetic workloads: phases of identical requests, each with its arrival process, merged in time."""

from __future__ import annotations

from pathlib import Path

import msgspec
import polars as pl

from filledfirst.contracts.stats import ScheduleStats
from filledfirst.errors import UserError
from filledfirst.schedule import as_schedule, write_schedule
from filledfirst.study import SyntheticPhase, SyntheticWorkload
from filledfirst.workloads.arrivals import arrival_times

# A prefix's id is its phase's index times this plus its own: phases never share a prefix.
_PHASE_IDS = 1 << 32


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
        if phase.rate is not None:
            raise UserError(
                f"phase {order} ({phase.role}): its rate is relative to the knee of {phase.rate.of}: "
                "resolve it first (filledfirst workload synth reads the search's search.json)")
        count = phase.count
        _check_prefix(order, phase)
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
                    **_prefix_columns(order, phase),
                },
                schema_overrides={"_phase": pl.Int64, "_k": pl.Int64, "prefix_blocks": pl.List(pl.Int64),
                                  "block_tokens": pl.Int64},
            )
        )
    merged = pl.concat(parts).sort(["t_offset_s", "_phase", "_k"], maintain_order=True)
    # An unbounded cache serves a prefix to every request after its first (in arrival order).
    shared = merged["prefix_blocks"].list.len() > 0
    ideal = pl.when(shared & ~pl.col("prefix_blocks").is_first_distinct()).then(pl.col("block_tokens")).otherwise(0)
    return as_schedule(merged.with_columns(ideal.cast(pl.Int64).alias("ideal_cached_tokens")))


def _check_prefix(order: int, phase: SyntheticPhase) -> None:
    shared = phase.shared_prefix
    if shared is not None and shared.tokens >= phase.prompt_tokens:
        raise UserError(f"phase {order} ({phase.role}): shared_prefix.tokens {shared.tokens} must be below "
                        f"prompt_tokens {phase.prompt_tokens} (the server computes at least a prompt's last token)")


def _prefix_columns(order: int, phase: SyntheticPhase) -> dict[str, list]:
    """One prefix block per request, the whole shared prefix, so the prompt builder gives
    requests of one prefix the same first `tokens` tokens (loadgen.prompts)."""
    shared = phase.shared_prefix
    if shared is None:
        return {"prefix_blocks": [[]] * phase.count, "block_tokens": [0] * phase.count}
    return {"prefix_blocks": [[order * _PHASE_IDS + k % shared.prefixes] for k in range(phase.count)],
            "block_tokens": [shared.tokens] * phase.count}


def prefix_stats(schedule: pl.DataFrame) -> dict:
    """The ScheduleStats fields of a schedule's shared prefixes (none without them)."""
    shared = schedule.filter(pl.col("block_tokens") > 0)
    if shared.is_empty():
        return {}
    return {"block_tokens": int(shared["block_tokens"].max()),
            "ideal_hit_share": int(schedule["ideal_cached_tokens"].sum()) / int(schedule["prompt_tokens"].sum())}


def write_synthetic_schedule(spec: SyntheticWorkload | dict, out: Path, extra_stats: dict | None = None
                             ) -> ScheduleStats:
    """The schedule and its `.stats.json` (with `extra_stats`, ScheduleStats fields: e.g.
    `relative`, what a relative rate resolved to); returns the stats."""
    spec = _typed(spec)
    schedule = synthetic_schedule(spec)
    return write_schedule(schedule, out, {"source": "synthetic", "phases": len(spec.phases),
                                          **prefix_stats(schedule), **(extra_stats or {})})
