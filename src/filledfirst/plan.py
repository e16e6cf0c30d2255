"""The study's jobs, built once from the typed study: which searches and experiments share
one server start, in which order, with the files each job reads and writes.

Snakemake's rules are made from it (workflow/rules/*.smk), and `filledfirst job NAME`
builds the same plan from the same config files and runs the job of that name: nothing
about a job travels on its command line but its name.

A job is either a **search job** (one or more searches that probe exactly the same server,
one after the other on one start, then the experiments placed relative to their knees that
need that very server, then the paired checks of their interventions judged side by side
alone) or an **experiment job** (experiments with identical server
settings, one after the other on one start). All paths are relative to the workflow's
working directory.
"""

from __future__ import annotations

import msgspec

from filledfirst.config import (
    checks_of,
    group_fingerprint,
    hosted_experiments,
    search_fingerprint,
    search_groups,
    server_groups,
    workload_fingerprint,
)
from filledfirst.contracts.search import PREDICTION_JSON
from filledfirst.engines import llamacpp
from filledfirst.errors import UserError
from filledfirst.frontier.plan import frontier_plan
from filledfirst.frontier.relative import knee_searches, split_of
from filledfirst.study import Study, TraceWorkload

RESULTS = "results"
LOGS = f"{RESULTS}/logs"


def search_dir(frontier: str, setting: str) -> str:
    return f"{RESULTS}/frontiers/{frontier}/{setting}"


def search_json(frontier: str, setting: str) -> str:
    """A search's result, which stands for its probe folders beside it."""
    return f"{search_dir(frontier, setting)}/search.json"


def prediction_json(frontier: str, setting: str) -> str:
    """An intervention's predicted start, beside its search.json."""
    return f"{search_dir(frontier, setting)}/{PREDICTION_JSON}"


def search_json_of(of: str) -> str:
    """The search.json of `<frontier>/<setting>`."""
    return search_json(*split_of(of))


def run_dir(experiment: str) -> str:
    return f"{RESULTS}/runs/{experiment}"


def schedule_path(workload: str) -> str:
    return f"data/schedules/{workload}.parquet"


def schedule_stats(workload: str) -> str:
    """A schedule's stats beside it (for a trace window: its density)."""
    return f"{schedule_path(workload)}.stats.json"


def trace_csv(trace: str) -> str:
    return f"data/traces/{trace}.csv"


class SearchStep(msgspec.Struct, frozen=True):
    """One search of a search job, with what it reads of a trace workload (its CSV and its
    schedule's stats, the window's density)."""

    frontier: str
    setting: str
    fingerprint: str  # changes whenever anything that decides a probe or the search's path does
    trace_csv: str | None = None
    shape_stats: str | None = None

    @property
    def key(self) -> str:
        return f"{self.frontier}/{self.setting}"

    @property
    def out(self) -> str:
        return search_dir(self.frontier, self.setting)

    @property
    def result(self) -> str:
        return search_json(self.frontier, self.setting)


class ExperimentStep(msgspec.Struct, frozen=True):
    """One experiment of a job. `schedule` is None for one a search job runs after its
    searches: its schedule is made there, from their knees."""

    experiment: str
    workload: str
    schedule: str | None = None
    # the search whose server it runs on, for one a search job runs
    after_search: str | None = None
    trace_csv: str | None = None  # a trace workload's CSV, for one a search job runs

    @property
    def out(self) -> str:
        return run_dir(self.experiment)


class Inputs(msgspec.Struct, frozen=True):
    """What a job reads, by kind."""

    model: list[str] = []
    schedules: list[str] = []  # one per experiment of an experiment job, in order
    parents: list[str] = []  # an intervention's parent search.json
    predicted: list[str] = []  # an intervention's predicted start (PredictionStep)
    knees: list[str] = []  # search.json of other searches its experiments are placed relative to
    traces: list[str] = []  # trace CSVs its searches and experiments read
    stats: list[str] = []  # a trace-shaped search's schedule stats


class Job(msgspec.Struct, frozen=True):
    name: str
    searches: list[SearchStep]
    experiments: list[ExperimentStep]
    inputs: Inputs
    fingerprint: str  # changes whenever anything that decides the job's outcome does
    # interventions of its searches judged side by side alone: their paired checks, last
    checks: list[SearchStep] = []

    @property
    def search_outputs(self) -> list[str]:
        return [s.result for s in (*self.searches, *self.checks)]

    @property
    def run_outputs(self) -> list[str]:
        return [e.out for e in self.experiments]

    @property
    def log(self) -> str:
        if self.searches:
            return f"{LOGS}/frontier-{self.searches[0].frontier}-{self.searches[0].setting}.log"
        return f"{LOGS}/run-{self.experiments[0].experiment}.log"


class ScheduleStep(msgspec.Struct, frozen=True):
    """A workload's schedule: the knees it is placed relative to, a trace's CSV."""

    workload: str
    knees: list[str]  # search.json files
    trace_csv: str | None
    fingerprint: str

    @property
    def out(self) -> str:
        return schedule_path(self.workload)

    @property
    def stats(self) -> str:
        return schedule_stats(self.workload)


class PredictionStep(msgspec.Struct, frozen=True):
    """An intervention's predicted start (`filledfirst frontier predict`), in its search's
    folder, made from `searches`: the study's searches that are not interventions (and do
    not wait for one)."""

    frontier: str
    setting: str
    searches: list[str]
    fingerprint: str  # the intervention's search's: a changed relaxation or shape predicts again

    @property
    def name(self) -> str:
        return f"predict_{self.frontier}_{self.setting}"

    @property
    def out(self) -> str:
        return prediction_json(self.frontier, self.setting)

    @property
    def log(self) -> str:
        return f"{LOGS}/predict-{self.frontier}-{self.setting}.log"


class Plan(msgspec.Struct, frozen=True):
    jobs: list[Job]
    schedules: dict[str, ScheduleStep]  # workload -> its schedule
    # every search.json, in config order (frontiers, then their settings): what ingest reads
    search_results: list[str]
    predictions: list[PredictionStep] = []  # one per searched intervention

    def job(self, name: str) -> Job:
        for job in self.jobs:
            if job.name == name:
                return job
        raise UserError(f"no job {name!r} in the study's plan ({', '.join(j.name for j in self.jobs) or 'none'})")

    @property
    def run_folders(self) -> list[str]:
        """Every experiment's run folder, by name."""
        return sorted(path for job in self.jobs for path in job.run_outputs)


def model_inputs(study: Study) -> list[str]:
    """What every server reads the model from: its folder, built (tiny), fetched (hub), or
    the user's own (path: Snakemake then says it is missing before anything starts); for
    llama.cpp's server the GGUF file written from it (or the user's own .gguf)."""
    folder = study.model.folder
    if not folder:
        return []
    return [llamacpp.gguf_file(folder)] if study.engine.launcher == "llamacpp" else [folder]


def build_plan(study: Study) -> Plan:
    """The study's jobs: search jobs in config order (frontiers, then their settings), then
    experiment jobs in config order; and every workload's schedule."""
    if not (study.experiments or study.frontiers):
        raise UserError("nothing to run: the study has no experiments, sweeps or frontiers")
    hosted, checks = hosted_experiments(study), checks_of(study)
    jobs = [_search_job(study, [split_of(m) for m in members], hosted, checks)
            for members in search_groups(study).values()]
    jobs += [_experiment_job(study, members) for members in server_groups(study).values()]
    schedules = {name: ScheduleStep(name, schedule_knees(study, name), _trace_of(study, name),
                                    workload_fingerprint(study, name))
                 for name in study.workloads}
    searches = [search_json(f, s) for f in study.frontiers for s in frontier_plan(study, f).settings]
    return Plan(jobs, schedules, searches, _predictions(study, jobs))


def _predictions(study: Study, jobs: list[Job]) -> list[PredictionStep]:
    """Each searched intervention's prediction, from its parent's search and the others that are
    not interventions, less those whose job waits, directly or through other searches'
    knees, for an intervention's (the prediction would wait for itself)."""
    relaxed = {search_json(f, s) for f in study.frontiers for s in frontier_plan(study, f).interventions}
    waiting = set(relaxed)
    while grown := {out for job in jobs if waiting & set(job.inputs.knees) for out in job.search_outputs} - waiting:
        waiting |= grown
    roots = [s for f in study.frontiers for s in (search_json(f, name) for name in frontier_plan(study, f).settings)
             if s not in waiting]
    fingerprints = {s.key: s.fingerprint for job in jobs for s in job.searches}
    out = []
    for f in study.frontiers:
        for setting, i in frontier_plan(study, f).interventions.items():
            if not i.search:  # no search to start: nothing to predict it for
                continue
            parent = search_json(f, i.parent)  # its job waits for the parent anyway
            out.append(PredictionStep(f, setting, roots if parent in roots else [parent, *roots],
                                      fingerprints[f"{f}/{setting}"]))
    return out


def schedule_knees(study: Study, workload: str) -> list[str]:
    """The search.json of every search the workload's rates are relative to."""
    return [search_json_of(of) for of in knee_searches(study.workloads[workload])]


def _trace_of(study: Study, workload: str) -> str | None:
    wl = study.workloads[workload]
    return trace_csv(wl.trace) if isinstance(wl, TraceWorkload) else None


def _hosted_step(study: Study, experiment: str, search: str) -> ExperimentStep:
    workload = study.experiments[experiment].workload
    return ExperimentStep(experiment, workload, after_search=search, trace_csv=_trace_of(study, workload))


def _search_step(study: Study, frontier: str, setting: str) -> SearchStep:
    workload = frontier_plan(study, frontier).workload_name
    trace = _trace_of(study, workload)
    return SearchStep(frontier, setting, search_fingerprint(study, frontier, setting), trace,
                      schedule_stats(workload) if trace else None)


def _search_job(study: Study, members: list[tuple[str, str]], hosted: dict[str, list[str]],
                checks: dict[str, list[str]]) -> Job:
    steps = [_search_step(study, frontier, setting) for frontier, setting in members]
    judged = [_search_step(study, *split_of(c)) for s in steps for c in checks.get(s.key, [])]
    own = {s.key for s in steps}
    runs = [_hosted_step(study, exp, s.key) for s in steps for exp in hosted.get(s.key, [])]
    lead_frontier, lead_setting = members[0]
    relaxed = frontier_plan(study, lead_frontier).interventions.get(lead_setting)
    knees = sorted({of for e in runs for of in knee_searches(study.workloads[e.workload])} - own)
    traces = [s.trace_csv for s in steps if s.trace_csv]
    traces += sorted({e.trace_csv for e in runs if e.trace_csv and e.trace_csv not in traces})
    inputs = Inputs(
        model=model_inputs(study),
        parents=[search_json(lead_frontier, relaxed.parent)] if relaxed is not None else [],
        predicted=[prediction_json(lead_frontier, lead_setting)] if relaxed is not None else [],
        knees=[search_json_of(of) for of in knees],
        traces=traces,
        stats=[s.shape_stats for s in steps if s.shape_stats],
    )
    spec = " ".join(s.fingerprint for s in steps)
    if relaxed is not None and relaxed.paired:
        spec += " paired"
    if runs:
        spec += " " + group_fingerprint(study, [e.experiment for e in runs])
    if judged:
        spec += " checks " + " ".join(s.fingerprint for s in judged)
    return Job(f"frontier_{lead_frontier}_{lead_setting}", steps, runs, inputs, spec, judged)


def _experiment_job(study: Study, members: list[str]) -> Job:
    runs = [ExperimentStep(exp, study.experiments[exp].workload, schedule_path(study.experiments[exp].workload))
            for exp in members]
    inputs = Inputs(model=model_inputs(study), schedules=[r.schedule for r in runs if r.schedule])
    return Job(f"run_group_{members[0]}", [], runs, inputs, group_fingerprint(study, members))


