"""`filledfirst job NAME`: one job of the study's plan (filledfirst.plan), on one server
start: a search job's searches, then the experiments it runs on their server, then the
paired checks of their interventions judged side by side alone; or an experiment job's
experiments."""

from __future__ import annotations

from pathlib import Path

from filledfirst.plan import Job, SearchStep
from filledfirst.run.runner import Job as RunJob
from filledfirst.run.runner import run_experiments, warn_unfinished
from filledfirst.run.search import Hosted, SearchTask, run_searches, warn_failed
from filledfirst.study import Study


def _path(value: str | None) -> Path | None:
    return None if value is None else Path(value)


def run_job(study: Study, job: Job, *, progress: bool = True) -> None:
    """The job to its end. A failed run, or a search that ended on a failed probe, is a
    result: logged, not raised; an interruption raises."""
    if not job.searches:
        runs = [RunJob(e.experiment, Path(e.schedule), Path(e.out)) for e in job.experiments]
        warn_unfinished(runs, run_experiments(study, runs, progress=progress))
        return
    tasks = [_task(s) for s in job.searches]
    checks = [_task(s) for s in job.checks]
    hosted = Hosted(job.experiments, [Path(k) for k in job.inputs.knees]) if job.experiments else None
    warn_failed(tasks, run_searches(study, tasks, progress=progress, hosted=hosted, checks=checks))


def _task(s: SearchStep) -> SearchTask:
    return SearchTask(s.frontier, s.setting, Path(s.out), s.fingerprint, _path(s.trace_csv), _path(s.shape_stats))
