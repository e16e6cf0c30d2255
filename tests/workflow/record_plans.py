"""Record the shipped studies' plans for test_plan.py (run from the repository root after
a change to a study's jobs: `PYTHONPATH=src python tests/workflow/record_plans.py`)."""

import json
from pathlib import Path

from filledfirst.config import load_study
from filledfirst.plan import build_plan


def recorded(config: Path) -> dict:
    plan = build_plan(load_study([config]))
    jobs = [{"name": job.name,
             "inputs": sorted({p for paths in (job.inputs.model, job.inputs.schedules, job.inputs.parents,
                                               job.inputs.knees, job.inputs.traces, job.inputs.stats) for p in paths}),
             "outputs": [*job.search_outputs, *job.run_outputs], "log": job.log} for job in plan.jobs]
    schedules = {s.out: sorted([*s.knees, *([s.trace_csv] if s.trace_csv else [])])
                 for s in plan.schedules.values() if s.knees or s.trace_csv}  # those that wait for something
    return {"jobs": jobs, "schedules": schedules}


if __name__ == "__main__":
    for name in ("cpu", "config"):
        out = Path("tests/workflow/plans") / f"{name}.json"
        before = json.loads(out.read_text())
        after = recorded(Path("config") / f"{name}.yaml")
        out.write_text(json.dumps(after, indent=1) + "\n")
        print(out, "unchanged" if before == after else "recorded again")
