"""What one part of a study costs, measured inside one run of the whole study: the time of
the Snakemake jobs that only the part needs, plus, in jobs the part shares with the rest
(a server start its search or replay shares), the spans of the part's own runs. The rest
of the run is what the study would have taken without the part, measured in the same
run, on the same machine at the same time (two separate runs of a study differ by more
than a part costs: their searches take different paths).

    make demo && .venv/bin/python benchmarks/part_cost.py --part prefix_cache

(from the repository root; it reads the newest Snakemake log and results/, so run it
right after the study; a second)
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from filledfirst.config import load_study
from filledfirst.study import Study, TraceWorkload

REPO = Path(__file__).resolve().parent.parent
_STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
_RULE = re.compile(r"^(?:local)?(?:rule|checkpoint) (\S+):$")
_FINISHED = re.compile(r"Finished job(?:id:)? (\d+)")


@dataclass
class Job:
    rule: str
    started: datetime
    outputs: list[str] = field(default_factory=list)
    jobid: int | None = None
    finished: datetime | None = None

    @property
    def seconds(self) -> float:
        return (self.finished - self.started).total_seconds() if self.finished else 0.0


def jobs_of(log: Path) -> list[Job]:
    """The finished jobs of a Snakemake log, each with its outputs and its start and end."""
    jobs: dict[int, Job] = {}
    stamp: datetime | None = None
    current: Job | None = None
    for line in log.read_text().splitlines():
        text = line.strip()
        if m := _STAMP.match(text):
            stamp = datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y")
            current = None
        elif (m := _RULE.match(text)) and stamp is not None:
            current = Job(m.group(1), stamp)
        elif current is not None and text.startswith("output:"):
            current.outputs = [o.strip() for o in text.removeprefix("output:").split(",") if o.strip()]
        elif current is not None and text.startswith("jobid:"):
            current.jobid = int(text.removeprefix("jobid:"))
            jobs[current.jobid] = current
        elif (m := _FINISHED.search(text)) and stamp is not None and int(m.group(1)) in jobs:
            jobs[int(m.group(1))].finished = stamp
    return [j for j in jobs.values() if j.finished is not None]


def part_paths(study: Study, part: str) -> tuple[set[str], set[str]]:
    """The part's run folders (its experiments', its frontier's searches') and the
    schedules and traces only the part uses (a path starting with one is the part's: a
    schedule's stats beside it)."""
    if part not in study.sections:
        raise SystemExit(f"the study has no section {part!r}: {', '.join(study.sections)}")
    frontier = study.sections[part].knees
    runs = {f"results/runs/{name}" for name, e in study.experiments.items() if e.section == part}
    if frontier is not None:
        runs.add(f"results/frontiers/{frontier}/")
    mine = {e.workload for e in study.experiments.values() if e.section == part}
    others = {e.workload for e in study.experiments.values() if e.section != part}
    others |= {f.workload for name, f in study.frontiers.items() if name != frontier}
    if frontier is not None:
        mine.add(study.frontiers[frontier].workload)
    mine -= others
    inputs = {f"data/schedules/{w}.parquet" for w in mine}
    traces_mine = {wl.trace for w in mine if isinstance(wl := study.workloads[w], TraceWorkload)}
    traces_other = {wl.trace for w in others if isinstance(wl := study.workloads[w], TraceWorkload)}
    inputs |= {f"data/traces/{t}.csv" for t in traces_mine - traces_other}
    return runs, inputs


def _belongs(path: str, runs: set[str], inputs: set[str]) -> bool:
    if any(path.startswith(i) for i in inputs):
        return True
    return any(path == r.rstrip("/") or path.startswith(r.rstrip("/") + "/") for r in runs)


def _span(folders: Iterable[Path]) -> float:
    """Seconds from the first run's start to the last run's end over the run.json files
    in the folders (a file stands for the folder it is in: a search's search.json)."""
    starts, ends = [], []
    for folder in (f if f.is_dir() else f.parent for f in folders):
        for meta in [folder / "run.json", *folder.glob("*/run.json")]:
            if meta.is_file():
                doc = json.loads(meta.read_text())
                if doc.get("started_at") and doc.get("finished_at"):
                    starts.append(datetime.fromisoformat(doc["started_at"]))
                    ends.append(datetime.fromisoformat(doc["finished_at"]))
    return (max(ends) - min(starts)).total_seconds() if starts else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=REPO / "config" / "cpu.yaml")
    ap.add_argument("--part", required=True)
    ap.add_argument("--log", type=Path, help="the study's Snakemake log (default: the newest)")
    ap.add_argument("--root", type=Path, default=REPO, help="the folder the study ran in")
    args = ap.parse_args()
    log = args.log or max((args.root / ".snakemake" / "log").glob("*.snakemake.log"), key=lambda p: p.stat().st_mtime)
    study = load_study([args.config])
    runs, inputs = part_paths(study, args.part)
    jobs = jobs_of(log)
    if not jobs:
        raise SystemExit(f"{log}: no finished job")
    rows = []
    for job in jobs:
        mine = [o for o in job.outputs if _belongs(o, runs, inputs)]
        if mine and len(mine) == len(job.outputs):
            cost, how = job.seconds, "the whole job"
        elif mine:
            cost = sum(_span([args.root / o]) for o in mine)
            cost, how = min(cost, job.seconds), f"its runs in {', '.join(mine)}"
        else:
            continue
        rows.append((job, cost, how))
    total = sum(j.seconds for j in jobs)
    part = sum(c for _, c, _ in rows)
    wall = (max(j.finished for j in jobs) - min(j.started for j in jobs)).total_seconds()
    print(f"{log.name}: {len(jobs)} jobs, {total:.0f} s of jobs, {wall:.0f} s from the first start to the last end")
    print(f"part {args.part}:")
    print("| job | job s | the part's s | counted |")
    print("|---|---:|---:|---|")
    for job, cost, how in rows:
        print(f"| {job.rule} | {job.seconds:.0f} | {cost:.0f} | {how} |")
    rest = total - part
    print(f"the part: {part:.0f} s; the rest: {rest:.0f} s; the study with the part takes "
          f"{part / rest:+.1%} longer than without it")


if __name__ == "__main__":
    main()
