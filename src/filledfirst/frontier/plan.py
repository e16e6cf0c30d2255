"""A frontier as the search needs it, read out of the typed study in one place
(`frontier_plan`), so the config's representation can change without touching the rest."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import msgspec

from filledfirst.contracts.search import Intervention, SearchBounds, Slo
from filledfirst.deadline import run_deadline_s
from filledfirst.engines import settings_problem
from filledfirst.errors import UserError
from filledfirst.frontier.interventions import intervention_name, relaxations
from filledfirst.frontier.probes import probe_duration, shape_rate
from filledfirst.frontier.relative import relative_problems, relative_refs
from filledfirst.frontier.verdict import min_requests
from filledfirst.model.kv import block_size, kv_blocks, kv_budget_problem
from filledfirst.study import ExperimentSpec, Study, SyntheticWorkload, Workload

# Completions a closed loop counts, at least: with a small cap, estimate_batches rounds of
# it are a handful of requests, and their rate is noise (8 sequences, 3 rounds: 16 counted
# completions, whose rate moved by 17-47 % between two loops a minute apart on a warm server).
REFERENCE_MIN_COUNTED = 100
# A paired block's, at least: its rate is read only beside its pair's, measured right before
# or after it on the other setting, so the machine's wander falls on both.
PAIRED_MIN_COUNTED = 50


def paired_requests(concurrency: int) -> int:
    """A paired block's requests: whole rounds of `concurrency` (a round of the shape's
    equal requests ends together, so a count that stops inside one would bias the rate),
    the first its ramp, and at least PAIRED_MIN_COUNTED after it."""
    return concurrency * (1 + -(-PAIRED_MIN_COUNTED // concurrency))


@dataclass(frozen=True, slots=True)
class FrontierPlan:
    name: str
    workload_name: str
    workload: Workload  # the shape
    settings: dict[str, dict[str, Any]]  # setting name -> vLLM settings, engine.server's under them
    slo: Slo
    probe_s: float
    bounds: SearchBounds
    probe_lifetimes: float = 0.0
    probe_max_s: float = math.inf
    probe_stretches: int = 1  # of a trace window (filledfirst.frontier.probes)
    estimate_batches: int | None = None  # None: no capacity estimate, the search grows from start
    drift_max: float = math.inf
    # setting name -> the limit it relaxes of another setting (frontier.interventions);
    # its vLLM settings are in `settings` like any other's
    interventions: dict[str, Intervention] = dataclasses.field(default_factory=dict)
    launcher: str = "cpu"  # the engine's (a KV budget's block size is the platform's)

    def estimate_concurrency(self, setting: str) -> int | None:
        """The closed loop's concurrency for the capacity estimate: the setting's
        max_num_seqs, or fewer when its KV budget holds fewer requests of the shape
        (`kv_fit`: beyond them the loop's requests only wait, or are preempted, and the
        loop lasts longer for the same rate); None: no estimate, for want of one or of a
        cap to fill, and none for an intervention, which starts from its parent's knee."""
        if not self.estimate_batches or setting in self.interventions:
            return None
        return self.holds(setting)

    def holds(self, setting: str) -> int | None:
        """How many requests of the shape the setting runs at once: its max_num_seqs, or
        fewer when its KV budget holds fewer (`kv_fit`); None: no cap stated."""
        cap = self.settings[setting].get("max_num_seqs")
        return None if not cap else min(int(cap), self.kv_fit(setting) or int(cap))

    def kv_fit(self, setting: str) -> int | None:
        """How many of the shape's largest requests the setting's KV budget holds at once
        (vLLM keeps one block back); None: no budget stated, or a trace's sizes vary."""
        blocks = kv_blocks(self.launcher, self.settings[setting])
        if blocks is None or not isinstance(self.workload, SyntheticWorkload):
            return None
        size = block_size(self.launcher, self.settings[setting])
        per = max(-(-(p.prompt_tokens + p.output_tokens) // size) for p in self.workload.phases)
        return max(1, (blocks - 1) // per)

    def paired_concurrency(self, setting: str) -> int | None:
        """An intervention's paired blocks' closed loop: as many requests as the larger of
        its setting and its parent's runs at once (`holds`: beyond them requests only wait
        on either side); None: neither states a cap."""
        relaxed = self.interventions[setting]
        return max((n for s in (relaxed.parent, setting) if (n := self.holds(s)) is not None), default=None)

    def reference_requests(self, concurrency: int) -> int:
        """The closed loop's requests: estimate_batches rounds of `concurrency`, and at
        least REFERENCE_MIN_COUNTED after the first round (which the throughput leaves out)."""
        return max((self.estimate_batches or 0) * concurrency, concurrency + REFERENCE_MIN_COUNTED)

    def probe_duration(self, done, rate: float) -> float:
        """Seconds of arrivals of the next probe, at `rate`, after the probes `done`
        (filledfirst.frontier.probes)."""
        return probe_duration(self.probe_s, self.probe_lifetimes, self.probe_max_s, done, rate,
                              min_requests(self.bounds.target, self.bounds.confidence))

    @property
    def longest_probe_s(self) -> float:
        return max(self.probe_s, self.probe_max_s)


def _own_settings(study: Study, name: str) -> dict[str, dict[str, Any]]:
    """The frontier's settings as vLLM settings, engine.server's under the setting's."""
    base = study.engine.server.given()
    return {s: {**base, **over.given()} for s, over in study.frontiers[name].settings.items()}


def tested(study: Study, name: str) -> dict[str, tuple[list[Intervention], list[str]]]:
    """The frontier's settings its `interventions` name -> their interventions and why any
    cannot be made (filledfirst.frontier.interventions.relaxations)."""
    own = _own_settings(study, name)
    wanted = study.frontiers[name].interventions
    if wanted is None:
        return {}
    names = list(own) if wanted.settings is True else list(wanted.settings or [])
    return {s: relaxations(s, own[s], study.engine.launcher, wanted.min_shift, wanted.factor, wanted.paired,
                           wanted.search)
            for s in names if s in own}


def searched_settings(study: Study, name: str) -> tuple[dict[str, dict[str, Any]], dict[str, Intervention]]:
    """The frontier's searches: setting name -> vLLM settings (engine.server's under the
    setting's), its settings first, then each tested setting's interventions; and the
    interventions by name."""
    settings = _own_settings(study, name)
    wanted = study.frontiers[name].interventions  # None only when tested() is empty
    interventions = {intervention_name(s, i.knob, wanted.factor): i
                     for s, (made, _) in tested(study, name).items() for i in made}
    return {**settings, **{n: {**settings[i.parent], **i.changes} for n, i in interventions.items()}}, interventions


def frontier_plan(study: Study, name: str) -> FrontierPlan:
    """The frontier `name` of the study."""
    f = study.frontiers[name]
    settings, interventions = searched_settings(study, name)
    return FrontierPlan(
        name=name,
        workload_name=f.workload,
        workload=study.workloads[f.workload],
        settings=settings,
        interventions=interventions,
        launcher=study.engine.launcher,
        slo=f.slo,
        probe_s=float(f.probe_s),
        probe_lifetimes=float(f.probe_lifetimes),
        probe_max_s=float(f.probe_max_s),
        probe_stretches=f.probe_stretches,
        estimate_batches=f.estimate_batches if f.estimate else None,
        drift_max=float(f.drift_max),
        bounds=SearchBounds(
            start=f.start, maximum=f.maximum, target=f.target_attainment, growth=f.growth,
            precision=f.precision, budget=f.budget, repeats=f.repeats, confidence=f.confidence,
            backlog_max_growth=f.backlog_max_growth, extensions=f.extensions, estimate_step=f.estimate_step,
        ),
    )


def search_plan(study: Study, frontier: str, setting: str) -> FrontierPlan:
    """The plan of the search of `setting` of `frontier`; an error naming what exists when
    the study has no such search."""
    if frontier not in study.frontiers:
        raise UserError(f"frontier {frontier!r} is not in the config ({sorted(study.frontiers)})")
    plan = frontier_plan(study, frontier)
    if setting not in plan.settings:
        raise UserError(f"frontiers.{frontier}: no setting {setting!r} ({sorted(plan.settings)})")
    return plan


def probe_spec(study: Study, plan: FrontierPlan, setting: str, *, experiment: str, description: str,
               workload: Workload, concurrency: int | None = None) -> ExperimentSpec:
    """A probe's spec: server, model, engine and scrape as an experiment's; the load
    generator the study's, open loop (a closed loop of `concurrency` for the capacity
    estimate)."""
    mode = "open" if concurrency is None else "closed"
    return ExperimentSpec(
        experiment=experiment, description=description, workload_name=plan.workload_name, workload=workload,
        server=plan.settings[setting], model=study.model, engine=study.engine.start(),
        loadgen=msgspec.structs.replace(study.loadgen, mode=mode, concurrency=concurrency), scrape=study.scrape,
    )


def search_terms(plan: FrontierPlan) -> dict[str, Any]:
    """What decides a search's path besides its probes' spec (filledfirst.config.search_fingerprint)."""
    return {"slo": msgspec.structs.asdict(plan.slo), "probe_s": plan.probe_s, "probe_lifetimes": plan.probe_lifetimes,
            "probe_max_s": plan.probe_max_s, "probe_stretches": plan.probe_stretches,
            "bounds": dataclasses.asdict(plan.bounds), "estimate_batches": plan.estimate_batches,
            "drift_max": plan.drift_max}


def frontier_runtime_minutes(study: Study, name: str) -> int:
    """A search job's time limit on a cluster, erring long as filledfirst.cluster does: one
    server start-up, then `budget` probes of the longest a probe can last and a drain each."""
    plan = frontier_plan(study, name)
    # A probe is an open loop: its deadline (filledfirst.deadline) is its last arrival plus the drain.
    probe = run_deadline_s("open", 0, None, plan.longest_probe_s, study.loadgen.request_timeout_s, _drain_s(study))
    # The estimate's closed loop, before and after the search.
    caps = [c for s in plan.settings if (c := plan.estimate_concurrency(s))]
    loops = 2 * max((_loop_s(study, plan.reference_requests(c), c) for c in caps), default=0)
    return max(1, math.ceil((_startup_s(study) + plan.bounds.budget * probe + loops) / 60))


def paired_check_minutes(study: Study, name: str, setting: str) -> int:
    """The time limit of an intervention's paired check in its parent's job, erring long
    alike: two start-ups (the other side's, then the first side's again) and four closed loops."""
    plan = frontier_plan(study, name)
    n = plan.paired_concurrency(setting)
    loops = 0 if n is None else 4 * _loop_s(study, paired_requests(n), n)
    return max(1, math.ceil((2 * _startup_s(study) + loops) / 60))


def _startup_s(study: Study) -> float:
    startup = study.cluster.startup_allowance_s
    return float(study.engine.startup_timeout_s if startup is None else startup)


def _drain_s(study: Study) -> float:
    drain = study.cluster.drain_allowance_s
    return study.loadgen.drain_timeout_s if drain is None else drain


def _loop_s(study: Study, requests: int, concurrency: int) -> float:
    """A closed loop's deadline: its rounds x the request timeout."""
    return math.ceil(requests / concurrency) * study.loadgen.request_timeout_s


def frontier_problems(study: Study) -> list[str]:
    """Cross-references the schema cannot check, each naming its key path."""
    problems = []
    for name, f in study.frontiers.items():
        where = f"frontiers.{name}"
        wl = study.workloads.get(f.workload)
        if wl is None:
            problems.append(f"{where}.workload: {f.workload!r} is not in workloads ({sorted(study.workloads)})")
        elif relative_refs(wl):
            pass  # relative_problems names it: a search's shape must have absolute rates
        elif isinstance(wl, SyntheticWorkload):
            try:
                shape_rate(wl)
            except ValueError as exc:
                problems.append(f"{where}.workload: {f.workload!r}: {exc}")
        if f.probe_max_s < f.probe_s:
            problems.append(f"{where}: probe_max_s ({f.probe_max_s:g}) must be at least probe_s ({f.probe_s:g})")
        if f.target_attainment >= 1 and f.confidence > 0:
            problems.append(f"{where}: target_attainment 1 cannot be shown with an interval: set confidence 0 "
                            "(every request must then meet the SLO)")
        if not f.start < f.maximum:
            problems.append(f"{where}: start ({f.start:g}) must be below maximum ({f.maximum:g})")
        if f.interventions is not None and not (f.interventions.search or f.interventions.paired):
            problems.append(f"{where}.interventions: search: false leaves nothing to judge an intervention by: "
                            "set paired: true (the check side by side) or search: true")
        if f.interventions is not None and isinstance(f.interventions.settings, list):
            problems += [f"{where}.interventions.settings: {s!r} is not one of its settings ({sorted(f.settings)})"
                         for s in f.interventions.settings if s not in f.settings]
        for s, server in searched_settings(study, name)[0].items():
            launcher = study.engine.launcher
            if why := kv_budget_problem(launcher, server, study.model.max_model_len) or settings_problem(
                    launcher, server):
                problems.append(f"{where}.settings.{s}: {why}")
        for s, (made, why) in tested(study, name).items():
            problems += [f"{where}.interventions: {w}" for w in why]
            problems += [f"{where}.settings: {n!r} is the name of an intervention of {s!r}: rename it"
                         for n in (intervention_name(s, i.knob, f.interventions.factor) for i in made)
                         if n in f.settings]
    return problems + relative_problems(study)
