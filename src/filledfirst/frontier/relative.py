"""Rates placed relative to a measured knee (the config's `{of: <frontier>/<setting>, times: X}`).

The knee of a capacity search is its result's `lo`: the highest rate that held the SLO.
A search that ended without one (it broke at `start`, or its first probe failed) has no
knee, and a workload placed relative to it is an error naming the search and its reason.

- synthetic: a phase's `interval_s: {of, times}` becomes 1 / (times x knee), so that
  phase arrives at times x knee requests/s; its count, its start and the other phases
  stay as written (a mixed workload keeps, e.g., its probes where they were designed).
- trace: `time_scale: {of, times}` becomes kept_per_s / (times x knee), where kept_per_s
  is the requests the window keeps per second of trace time: the mapping the search uses
  for its trace probes (filledfirst.frontier.probes.trace_kept_rate, trace_time_scale).

What was resolved (the search, its reason, the knee, times, the rate and the interval or
time scale) goes into the schedule's `.stats.json` under `relative`, a list.
The Snakemake DAG (workflow/rules/common.smk, `knee_inputs`) makes each such schedule
after the searches it names.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from filledfirst.errors import UserError


def is_relative(value: Any) -> bool:
    """A config value of the form {of, times} (a dict, or the typed RelativeRate)."""
    return isinstance(value, dict) or hasattr(value, "times")


def _of_times(value: Any) -> tuple[str, float]:
    if isinstance(value, dict):
        return value["of"], float(value["times"])
    return value.of, float(value.times)


def split_of(of: str) -> tuple[str, str]:
    """`<frontier>/<setting>` -> (frontier, setting)."""
    frontier, _, setting = of.partition("/")
    return frontier, setting


def relative_refs(workload: dict) -> list[tuple[str, str]]:
    """Every (key path inside the workload, `<frontier>/<setting>`) a workload is placed
    relative to, in config order."""
    refs = []
    if workload.get("kind") == "trace":
        if is_relative(workload.get("time_scale")):
            refs.append(("time_scale", _of_times(workload["time_scale"])[0]))
    else:
        for i, phase in enumerate(workload.get("phases", [])):
            if is_relative(phase.get("interval_s")):
                refs.append((f"phases[{i}].interval_s", _of_times(phase["interval_s"])[0]))
    return refs


def knee_searches(workload: dict) -> list[str]:
    """The `<frontier>/<setting>` searches a workload needs, each once, sorted."""
    return sorted({of for _, of in relative_refs(workload)})


def relative_problems(cfg: dict) -> list[str]:
    """Cross-references the schema cannot check, each naming its key path: `of` names an
    existing frontier and one of its settings; a frontier's own workload is not relative
    (its search would wait for itself)."""
    problems = []
    frontiers = cfg.get("frontiers", {}) or {}
    for name, wl in cfg.get("workloads", {}).items():
        for where, of in relative_refs(wl):
            path = f"workloads.{name}.{where}.of"
            frontier, setting = split_of(of)
            if frontier not in frontiers:
                problems.append(f"{path}: {of!r}: no frontier {frontier!r} in frontiers ({sorted(frontiers)})")
            elif setting not in frontiers[frontier].get("settings", {}):
                problems.append(f"{path}: {of!r}: frontier {frontier!r} has no setting {setting!r} "
                                f"({sorted(frontiers[frontier].get('settings', {}))})")
    for name, f in frontiers.items():
        wl = cfg.get("workloads", {}).get(f.get("workload"))
        if wl is not None and relative_refs(wl):
            problems.append(f"frontiers.{name}.workload: {f['workload']!r} is placed relative to a knee "
                            f"({', '.join(knee_searches(wl))}): a search's shape must have absolute rates")
    return problems


def load_knees(paths: list[Path]) -> dict[str, dict]:
    """`<frontier>/<setting>` -> that search.json (from its own frontier and setting keys)."""
    out: dict[str, dict] = {}
    for path in paths:
        try:
            doc = json.loads(Path(path).read_text())
            key = f"{doc['frontier']}/{doc['setting']}"
            if not isinstance(doc["result"], dict):
                raise TypeError("its result is not an object")
        except FileNotFoundError:
            raise UserError(f"knee file {path} does not exist (has the capacity search run?)") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"knee file {path} is not a capacity search's search.json ({exc})") from None
        out[key] = {**doc, "_path": str(path)}
    return out


def knee(of: str, knees: dict[str, dict]) -> dict:
    """The knee of search `of`: {of, knee_rps, reason, search}; an error when it has none."""
    if of not in knees:
        raise UserError(f"the capacity search {of} is needed (a rate is placed relative to its knee): "
                        f"give its search.json (have: {sorted(knees) or 'none'})")
    doc = knees[of]
    result = doc["result"]
    lo = result.get("lo")
    if lo is None or not (math.isfinite(float(lo)) and float(lo) > 0):
        why = result.get("reason")
        detail = f": {result['error']}" if result.get("error") else ""
        start = (doc.get("bounds") or {}).get("start")
        hint = f" (even the start rate {start:g} req/s broke the SLO)" if why == "breaks_at_start" and start else ""
        raise UserError(f"the capacity search {of} ({doc.get('_path', 'search.json')}) found no knee: "
                        f"no rate held, it ended with {why}{hint}{detail}; "
                        "lower the frontier's start or loosen its SLO")
    return {"of": of, "knee_rps": float(lo), "reason": result.get("reason"), "search": doc.get("_path")}


def resolve_synthetic(spec: dict, knees: dict[str, dict]) -> tuple[dict, list[dict]]:
    """The synthetic workload spec with every relative interval_s made absolute, and what
    was resolved (one entry per relative phase); `spec` is unchanged."""
    phases, resolved = [], []
    for i, phase in enumerate(spec["phases"]):
        q = dict(phase)
        if is_relative(phase.get("interval_s")):
            of, times = _of_times(phase["interval_s"])
            k = knee(of, knees)
            rate = times * k["knee_rps"]
            q["interval_s"] = 1.0 / rate
            resolved.append({"key": f"phases[{i}].interval_s", "role": phase.get("role"), **k, "times": times,
                             "rate_rps": rate, "interval_s": q["interval_s"]})
        phases.append(q)
    return {**spec, "phases": phases}, resolved


def resolve_time_scale(of: str, times: float, knees: dict[str, dict], kept_per_s: float) -> tuple[float, dict]:
    """The time scale at which a trace window keeping `kept_per_s` requests per trace
    second offers times x the knee of `of`, and what was resolved."""
    from filledfirst.frontier.probes import trace_time_scale

    k = knee(of, knees)
    rate = float(times) * k["knee_rps"]
    scale = trace_time_scale(kept_per_s, rate)
    return scale, {"key": "time_scale", **k, "times": float(times), "rate_rps": rate, "kept_per_s": kept_per_s,
                   "time_scale": scale}
