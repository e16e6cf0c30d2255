"""`filledfirst job NAME`: one job of the study's plan (filledfirst.plan), on one server
start: a search job's searches, then the experiments it runs on their server; or an
experiment job's experiments."""

from __future__ import annotations

import logging
from pathlib import Path

from filledfirst.plan import Job, trace_csv
from filledfirst.run.runner import Job as RunJob
from filledfirst.run.runner import run_experiments
from filledfirst.run.search import Hosted, SearchTask, run_searches
from filledfirst.study import Study, TraceWorkload

log = logging.getLogger(__name__)


def _path(value: str | None) -> Path | None:
    return None if value is None else Path(value)


def run_job(study: Study, job: Job, *, progress: bool = True) -> None:
    """The job to its end. A failed run or a search that ended on a failed probe is a
    result (its run.json or search.json says why): it is logged, not raised, so that
    Snakemake keeps the folders for the report; an interruption raises."""
    if not job.searches:
        runs = [RunJob(e.experiment, Path(e.schedule), Path(e.out)) for e in job.experiments]
        statuses = run_experiments(study, runs, progress=progress)
        for run, status in zip(runs, statuses):
            if status != "ok":
                log.warning("experiment %s: %s (see %s/run.json); the folder is kept for the report. "
                            "To run it again, delete the folder or use snakemake --forcerun.",
                            run.experiment, status, run.out)
        return
    tasks = [SearchTask(s.frontier, s.setting, Path(s.out), s.fingerprint, _path(s.trace_csv), _path(s.shape_stats))
             for s in job.searches]
    traces = {wl.trace: Path(trace_csv(wl.trace)) for e in job.experiments
              if isinstance(wl := study.workloads[e.workload], TraceWorkload)}
    hosted = Hosted([(e.experiment, Path(e.out)) for e in job.experiments], [Path(k) for k in job.inputs.knees],
                    traces) if job.experiments else None
    searches = run_searches(study, tasks, progress=progress, hosted=hosted)
    for task, search in zip(tasks, searches):
        if search.result.error:
            log.warning("search %s/%s: a probe failed (%s); see %s/search.json",
                        task.frontier, task.setting, search.result.error.splitlines()[0], task.out)
