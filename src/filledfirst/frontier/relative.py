"""Relative rates: a workload's `rate: {of: <frontier>/<setting>, times: X}`, X times that search's knee.

The knee of a capacity search is its result's `lo`: the highest rate that held the SLO.
A search that ended without one (it broke at `start`, or its first probe failed) has no
knee, and a workload placed relative to it is an error naming the search and its reason.

- synthetic: a phase's `rate` becomes its interval_s, 1 / (times x knee), so that
  phase arrives at times x knee requests/s; its count, its start and the other phases
  stay as written (a mixed workload keeps, e.g., its probes where they were designed).
- trace: the window's `rate` becomes its time_scale, kept_per_s / (times x knee), where kept_per_s
  is the requests the window keeps per second of trace time: the mapping the search uses
  for its trace probes (filledfirst.frontier.probes.trace_kept_rate, trace_time_scale).

What was resolved (the search, its reason, the knee, times, the rate and the interval or
time scale) goes into the schedule's `.stats.json` under `relative`, a list.
The Snakemake DAG (workflow/rules/common.smk, `knee_inputs`) makes each such schedule
after the searches it names.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, NamedTuple

import msgspec

from filledfirst.contracts.search import SearchRecord, StopReason
from filledfirst.contracts.stats import Placement, ScheduleStats
from filledfirst.errors import UserError
from filledfirst.frontier.probes import trace_kept_rate, trace_time_scale
from filledfirst.study import Study, SyntheticWorkload, TraceWorkload, Workload


def split_of(of: str) -> tuple[str, str]:
    """`<frontier>/<setting>` -> (frontier, setting)."""
    frontier, _, setting = of.partition("/")
    return frontier, setting


def relative_refs(workload: Workload) -> list[tuple[str, str]]:
    """Every (key path inside the workload, `<frontier>/<setting>`) a workload is placed
    relative to, in config order."""
    if isinstance(workload, TraceWorkload):
        return [("rate", workload.rate.of)] if workload.rate is not None else []
    return [(f"phases[{i}].rate", phase.rate.of) for i, phase in enumerate(workload.phases) if phase.rate is not None]


def knee_searches(workload: Workload) -> list[str]:
    """The `<frontier>/<setting>` searches a workload needs, each once, sorted."""
    return sorted({of for _, of in relative_refs(workload)})


def relative_problems(study: Study) -> list[str]:
    """Cross-references the schema cannot check, each naming its key path: `of` names an
    existing frontier and one of its settings; a frontier's own workload is not relative
    (its search would wait for itself)."""
    problems = []
    frontiers = study.frontiers
    for name, wl in study.workloads.items():
        for where, of in relative_refs(wl):
            path = f"workloads.{name}.{where}.of"
            frontier, setting = split_of(of)
            if frontier not in frontiers:
                problems.append(f"{path}: {of!r}: no frontier {frontier!r} in frontiers ({sorted(frontiers)})")
            elif setting not in frontiers[frontier].settings:
                problems.append(f"{path}: {of!r}: frontier {frontier!r} has no setting {setting!r} "
                                f"({sorted(frontiers[frontier].settings)})")
    for name, f in frontiers.items():
        wl = study.workloads.get(f.workload)
        if wl is not None and relative_refs(wl):
            problems.append(f"frontiers.{name}.workload: {f.workload!r} is placed relative to a knee "
                            f"({', '.join(knee_searches(wl))}): a search's shape must have absolute rates")
    return problems


class KneeFile(NamedTuple):
    """A capacity search's search.json given for its knee, and where it was read from."""

    path: Path
    search: SearchRecord


def load_knees(paths: list[Path]) -> dict[str, KneeFile]:
    """`<frontier>/<setting>` (from the search's own frontier and setting) -> its search.json."""
    out: dict[str, KneeFile] = {}
    for path in map(Path, paths):
        try:
            search = SearchRecord.read(path)
        except FileNotFoundError:
            raise UserError(f"knee file {path} does not exist (has the capacity search run?)") from None
        out[search.key] = KneeFile(path, search)
    return out


def knee(of: str, knees: dict[str, KneeFile]) -> dict[str, Any]:
    """The knee of search `of`: the Placement fields of, knee_rps, reason and search; an
    error when it has none."""
    if of not in knees:
        raise UserError(f"the capacity search {of} is needed (a rate is placed relative to its knee): "
                        f"give its search.json (have: {sorted(knees) or 'none'})")
    path, search = knees[of]
    result = search.result
    lo = result.lo
    if result.reason == StopReason.NOT_SEARCHED:
        raise UserError(f"the capacity search {of} ({path}) was not searched (an intervention judged side by side "
                        "alone, interventions.search false): it has no knee to place a rate at")
    if lo is None or not (math.isfinite(lo) and lo > 0):
        detail = f": {result.error}" if result.error else ""
        hint = (f" (even the start rate {search.bounds.start:g} req/s broke the SLO)"
                if result.reason == StopReason.BREAKS_AT_START else "")
        raise UserError(f"the capacity search {of} ({path}) found no knee: "
                        f"no rate held, it ended with {result.reason}{hint}{detail}; "
                        "lower the frontier's start or loosen its SLO")
    return {"of": of, "knee_rps": lo, "reason": result.reason.value, "search": str(path)}


def resolve_synthetic(workload: SyntheticWorkload, knees: dict[str, KneeFile]
                      ) -> tuple[SyntheticWorkload, list[Placement]]:
    """The synthetic workload with every phase's relative rate made its interval_s, and
    what was resolved (one entry per relative phase)."""
    phases, resolved = [], []
    for i, phase in enumerate(workload.phases):
        if phase.rate is not None:
            k = knee(phase.rate.of, knees)
            times = float(phase.rate.times)
            rate = times * k["knee_rps"]
            phase = msgspec.structs.replace(phase, interval_s=1.0 / rate, rate=None)
            resolved.append(Placement(key=f"phases[{i}].rate", role=phase.role, **k, times=times,
                                      rate_rps=rate, interval_s=phase.interval_s))
        phases.append(phase)
    return msgspec.structs.replace(workload, phases=phases), resolved


def trace_scale_resolver(of: str, times: float,
                         knees: dict[str, KneeFile]) -> Callable[[int, float], tuple[float, Placement]]:
    """For a trace window (filledfirst.trace.subsample): (requests kept, trace seconds they
    span) -> the time scale at which it offers times x the knee of `of`, and what was
    resolved. The window's density is read as the search reads a trace shape's."""
    def resolve(kept: int, trace_s: float) -> tuple[float, Placement]:
        try:
            kept_per_s = trace_kept_rate(ScheduleStats(requests=kept, duration_s=trace_s, time_scale=1.0))
        except ValueError as exc:
            raise ValueError(f"a time scale relative to {of}: {exc}") from None
        return resolve_time_scale(of, times, knees, kept_per_s)

    return resolve


def resolve_time_scale(of: str, times: float, knees: dict[str, KneeFile], kept_per_s: float
                       ) -> tuple[float, Placement]:
    """The time scale at which a trace window keeping `kept_per_s` requests per trace
    second offers times x the knee of `of`, and what was resolved."""
    k = knee(of, knees)
    rate = float(times) * k["knee_rps"]
    scale = trace_time_scale(kept_per_s, rate)
    return scale, Placement(key="rate", **k, times=float(times), rate_rps=rate, kept_per_s=kept_per_s,
                            time_scale=scale)
