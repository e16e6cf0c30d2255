"""A frontier as the search needs it, read out of the study config in one place
(`frontier_plan`), so the config's representation can change without touching the rest."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from filledfirst.frontier.probes import probe_duration, shape_rate
from filledfirst.frontier.relative import relative_problems, relative_refs
from filledfirst.frontier.search import SearchBounds, Slo


@dataclass(frozen=True, slots=True)
class FrontierPlan:
    name: str
    workload_name: str
    workload: dict  # the shape: a synthetic or trace workload spec
    settings: dict[str, dict]  # setting name -> vLLM settings, engine.server merged in
    slo: Slo
    probe_s: float
    bounds: SearchBounds
    probe_lifetimes: float = 0.0
    probe_max_s: float = math.inf

    def probe_duration(self, done) -> float:
        """Seconds of arrivals of the next probe, after the probes `done` (filledfirst.frontier.probes)."""
        return probe_duration(self.probe_s, self.probe_lifetimes, self.probe_max_s, done)

    @property
    def longest_probe_s(self) -> float:
        return max(self.probe_s, self.probe_max_s) if self.probe_lifetimes > 0 else self.probe_s


def frontier_plan(cfg: dict, name: str) -> FrontierPlan:
    """The frontier `name` of a validated config; its defaults are the typed config's."""
    from filledfirst.config import deep_merge
    from filledfirst.study import as_study

    raw, f = cfg["frontiers"][name], as_study(cfg).frontiers[name]
    base = cfg["engine"].get("server", {})
    return FrontierPlan(
        name=name,
        workload_name=f.workload,
        workload=cfg["workloads"][f.workload],
        settings={s: deep_merge(base, over) for s, over in raw["settings"].items()},
        slo=Slo(ttft_ms=float(f.slo.ttft_ms), itl_ms=float(f.slo.itl_ms)),
        probe_s=float(f.probe_s),
        probe_lifetimes=float(f.probe_lifetimes),
        probe_max_s=float(f.probe_max_s),
        bounds=SearchBounds(
            start=f.start, maximum=f.maximum, target=f.target_attainment, growth=f.growth,
            precision=f.precision, budget=f.budget, repeats=f.repeats,
        ),
    )


def probe_base_spec(cfg: dict, plan: FrontierPlan, setting: str) -> dict:
    """Everything of a probe's spec but its workload (server, model, engine, loadgen,
    scrape), as an experiment's spec has them. The load generator is the study's, always
    open loop."""
    loadgen = {k: v for k, v in cfg.get("loadgen", {}).items() if k != "concurrency"}
    return {
        "server": plan.settings[setting],
        "model": cfg["model"],
        "engine": {k: v for k, v in cfg["engine"].items() if k != "server"},
        "loadgen": {**loadgen, "mode": "open"},
        "scrape": cfg.get("scrape", {}),
    }


def search_fingerprint(plan: FrontierPlan, base: dict) -> str:
    """Changes when anything that decides a probe's outcome or the search's path does
    (Snakemake re-runs the search; its probes measured before are not reused)."""
    from filledfirst.config import fingerprint

    return fingerprint({
        **base, "workload": plan.workload, "slo": dataclasses.asdict(plan.slo), "probe_s": plan.probe_s,
        "probe_lifetimes": plan.probe_lifetimes, "probe_max_s": plan.probe_max_s,
        "bounds": dataclasses.asdict(plan.bounds),
    })


def frontier_runtime_minutes(cfg: dict, name: str) -> int:
    """A search job's time limit on a cluster, erring long as filledfirst.cluster does: one
    server start-up, then `budget` probes of the longest a probe can last and a drain each."""
    from filledfirst.study import as_study

    plan, study = frontier_plan(cfg, name), as_study(cfg)
    startup = study.cluster.startup_allowance_s
    drain = study.cluster.drain_allowance_s
    startup = study.engine.startup_timeout_s if startup is None else startup
    drain = study.loadgen.drain_timeout_s if drain is None else drain
    return max(1, math.ceil((float(startup) + plan.bounds.budget * (plan.longest_probe_s + float(drain))) / 60))


def frontier_problems(cfg: dict) -> list[str]:
    """Cross-references the schema cannot check, each naming its key path."""
    problems = []
    workloads = cfg.get("workloads", {})
    for name, f in cfg.get("frontiers", {}).items():
        where = f"frontiers.{name}"
        wl = workloads.get(f["workload"])
        if wl is None:
            problems.append(f"{where}.workload: {f['workload']!r} is not in workloads ({sorted(workloads)})")
        elif relative_refs(wl):
            pass  # relative_problems names it: a search's shape must have absolute rates
        elif wl["kind"] == "synthetic":
            try:
                shape_rate(wl)
            except ValueError as exc:
                problems.append(f"{where}.workload: {f['workload']!r}: {exc}")
        if f.get("probe_max_s") is not None and f["probe_max_s"] < f.get("probe_s", f["probe_max_s"]):
            problems.append(f"{where}: probe_max_s ({f['probe_max_s']}) must be at least probe_s ({f['probe_s']})")
        if not f["start"] < f["maximum"]:
            problems.append(f"{where}: start ({f['start']}) must be below maximum ({f['maximum']})")
    return problems + relative_problems(cfg)
