"""What a job asks a batch system for: GPUs, CPUs, memory and a time limit.

One job of the study's plan (filledfirst.plan): one vLLM start, then the job's searches
and experiments one after the other. The SLURM profile (profiles/slurm) turns
these resources into sbatch options; a local run ignores them. Defaults are the schema's
(`cluster` in src/filledfirst/schemas/config.schema.yaml), read through filledfirst.study.

The time limit is the longest the job can legitimately take by the runner's own limits:
the server start-up (it gives up after `engine.startup_timeout_s`), then each
experiment's deadline (filledfirst.deadline, the one the replay keeps: open loop,
the last scheduled arrival plus `loadgen.drain_timeout_s`; closed loop, ceil(requests /
concurrency) x `loadgen.request_timeout_s`). A job SLURM stops at its limit fails with
every experiment it had not finished, so the estimate errs on the long side;
`cluster.startup_allowance_s` and `cluster.drain_allowance_s` tighten it.
"""

from __future__ import annotations

import errno
import math
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from filledfirst.config import server_settings
from filledfirst.deadline import run_deadline_s
from filledfirst.engine import devices
from filledfirst.errors import UserError
from filledfirst.frontier.plan import searched_settings
from filledfirst.plan import Job
from filledfirst.study import Cluster, Study

DEFAULT_CPUS = Cluster().cpus_per_job
DEFAULT_MEM_MB = Cluster().mem_mb
# The resource every job that starts a vLLM server holds one of. The workflow profile
# (workflow/profiles/default) makes one available, so a local `snakemake --cores N` never runs two
# servers at once (on one GPU: out of memory; on a CPU: two measurements that starve
# each other); the Snakefile scopes it `local`, so cluster jobs on their own nodes do not
# wait for each other. `--resources engine=N` says otherwise.
ENGINE = "engine"


def _external(study: Study, experiment: str) -> bool:
    return study.experiments[experiment].external is not None


def gpus_per_job(study: Study) -> int:
    """`cluster.gpus_per_job`, else for the gpu launcher the most GPUs any server of the
    study takes (its tensor_parallel_size, else one), and none for the cpu one."""
    if study.cluster.gpus_per_job is not None:
        return study.cluster.gpus_per_job
    if study.engine.launcher not in devices.GPU_LAUNCHERS:
        return 0
    servers = [server_settings(study, e) for e, exp in study.experiments.items() if exp.external is None]
    servers += [s for name in study.frontiers for s in searched_settings(study, name)[0].values()]
    return max((devices.needed(s) for s in servers), default=1)


def job_request(study: Study, members: list[str] | None = None) -> dict[str, int | str]:
    """The fixed part of an experiment job's resources: `engine` (the one-server-at-a-time
    token), and in the SLURM plugin's names `gpu` (sbatch --gpus) and `gpu_model`
    (--gpus=MODEL:N), or `gres` (--gres=gpu:N) with cluster.gpu_request gres,
    `cpus_per_task`, `mem_mb`, `slurm_partition`, `slurm_account`.
    A job that replays against an external endpoint (`server.url`) starts no server and
    asks for no GPU."""
    cluster = study.cluster
    external = bool(members) and all(_external(study, e) for e in members)
    gpus = 0 if external else gpus_per_job(study)
    out: dict[str, int | str] = {ENGINE: 0 if external else 1, "cpus_per_task": cluster.cpus_per_job,
                                 "mem_mb": cluster.mem_mb}
    if cluster.gpu_request == "gres":  # the plugin refuses gres beside gpu
        if gpus:
            out["gres"] = f"gpu:{cluster.gpu_model}:{gpus}" if cluster.gpu_model else f"gpu:{gpus}"
    else:
        out["gpu"] = gpus
        if gpus and cluster.gpu_model:
            out["gpu_model"] = cluster.gpu_model
    for key, value in (("slurm_partition", cluster.partition), ("slurm_account", cluster.account)):
        if value:
            out[key] = value
    return out


def last_arrival_s(schedule: str | Path) -> float:
    """The schedule's last arrival offset (0 for an empty schedule).

    A missing file raises FileNotFoundError naming exactly the path given, which
    Snakemake takes as "not known yet" while the schedule is still to be made."""
    if not Path(schedule).is_file():
        raise FileNotFoundError(errno.ENOENT, "schedule not written yet", str(schedule))
    col = pq.read_table(schedule, columns=["t_offset_s"]).column("t_offset_s")
    latest = pc.max(col).as_py()
    return float(latest) if latest is not None else 0.0


def schedule_requests(schedule: str | Path) -> int:
    """How many requests the schedule holds (from the Parquet footer: nothing read)."""
    if not Path(schedule).is_file():
        raise FileNotFoundError(errno.ENOENT, "schedule not written yet", str(schedule))
    return pq.ParquetFile(schedule).metadata.num_rows


def experiment_seconds(study: Study, experiment: str, schedule: str | Path) -> float:
    """Upper bound of one experiment's time on an already running server: its run's
    deadline, or with `cluster.drain_allowance_s` the allowance in place of the drain
    (closed loop: in place of the whole run)."""
    loadgen = study.loadgen_for(experiment)
    allowance = study.cluster.drain_allowance_s
    if loadgen.mode == "closed":
        if allowance is not None:
            return float(allowance)
        return run_deadline_s("closed", schedule_requests(schedule), loadgen.concurrency, 0.0,
                              loadgen.request_timeout_s, loadgen.drain_timeout_s)
    drain = loadgen.drain_timeout_s if allowance is None else allowance
    return run_deadline_s("open", 0, None, last_arrival_s(schedule), loadgen.request_timeout_s, drain)


def runtime_minutes(study: Study, members: list[str], schedules: list[str | Path]) -> int:
    """The time limit of the job running `members` (in order, one schedule each), in
    whole minutes: one server start-up, then every experiment's bound."""
    return _minutes(_runtime_parts(study, members, schedules))


def _runtime_parts(study: Study, members: list[str], schedules: list[str | Path]) -> list[tuple[str, float]]:
    """What an experiment job's time limit adds up, in seconds: its start-up, then each
    experiment's bound."""
    if len(members) != len(schedules):
        raise ValueError(f"{len(members)} experiments but {len(schedules)} schedules")
    startup = study.cluster.startup_allowance_s
    if startup is None:
        startup = study.engine.startup_timeout_s
    if all(_external(study, e) for e in members):
        startup = 0  # nothing to start
    return [("start-up", float(startup)), *((e, experiment_seconds(study, e, s)) for e, s in zip(members, schedules))]


def _minutes(parts: list[tuple[str, float]]) -> int:
    return max(1, math.ceil(sum(seconds for _, seconds in parts) / 60))


def within_limit(study: Study, job: str, parts: list[tuple[str, float]]) -> int:
    """The job's time limit in minutes, refused with its arithmetic (UserError) when it is
    longer than the partition takes (cluster.max_runtime_min)."""
    minutes, most = _minutes(parts), study.cluster.max_runtime_min
    if most is not None and minutes > most:
        sums = " + ".join(f"{name} {seconds / 60:.0f}" for name, seconds in parts)
        raise UserError(f"job {job} needs a time limit of {minutes} min ({sums}) and the partition takes at most "
                        f"{most} (cluster.max_runtime_min): give some of its experiments share_server: false "
                        "(a job each), shorten their schedules or the searches' budget and probe lengths, or use "
                        "a partition with a longer limit")
    return minutes


def hosted_seconds(study: Study, experiment: str, trace_csv: str | Path | None = None) -> float:
    """Upper bound of a hosted experiment's time on its search's server
    (filledfirst.config.hosted_experiments), before the knee it is placed relative to
    exists: every rate at the lowest knee its search can report (the search's `start`;
    a knee is a held rate, and no search probes below its start), arrivals allowed twice
    their mean span, as experiment_seconds would bound the schedule made then. A trace
    workload's window is read from `trace_csv` for its request count."""
    import tempfile

    from filledfirst.frontier.plan import frontier_plan
    from filledfirst.frontier.relative import split_of
    from filledfirst.study import SyntheticWorkload
    from filledfirst.trace.subsample import subsample_to_parquet


    def lowest(rate) -> float:  # requests/s at the lowest knee
        return float(rate.times) * frontier_plan(study, split_of(rate.of)[0]).bounds.start

    name = study.experiments[experiment].workload
    wl = study.workloads[name]
    if isinstance(wl, SyntheticWorkload):
        requests = sum(p.count for p in wl.phases)
        last = max(p.start_s + p.count * (1.0 / lowest(p.rate) if p.rate is not None else float(p.interval_s))
                   for p in wl.phases)
    else:
        from filledfirst.run.schedules import trace_window

        if trace_csv is None:
            raise ValueError(f"{experiment}: a trace workload's bound needs its trace's CSV")
        if not Path(trace_csv).is_file():  # Snakemake takes it as "not known yet"
            raise FileNotFoundError(errno.ENOENT, "trace not fetched yet", str(trace_csv))
        window = {**trace_window(study, name, {}), "relative": None, "time_scale": 1.0}
        with tempfile.TemporaryDirectory() as tmp:
            requests = subsample_to_parquet(Path(trace_csv), Path(tmp) / "window.parquet", role="trace",
                                            **window).requests or 0
        last = requests / lowest(wl.rate) if wl.rate is not None else (
            wl.minutes * 60.0 * float(wl.time_scale))
    loadgen = study.loadgen_for(experiment)
    allowance = study.cluster.drain_allowance_s
    if loadgen.mode == "closed":
        if allowance is not None:
            return float(allowance)
        return run_deadline_s("closed", requests, loadgen.concurrency, 0.0, loadgen.request_timeout_s,
                              loadgen.drain_timeout_s)
    drain = loadgen.drain_timeout_s if allowance is None else allowance
    return run_deadline_s("open", 0, None, 2.0 * last, loadgen.request_timeout_s, drain)


def job_resources(study: Study, job: Job) -> dict:
    """A job's resources as a Snakemake rule takes them: the fixed part (job_request), and a
    time limit of one start-up, then each search's probes and drains
    (filledfirst.frontier.plan), each paired check's starts and loops, then each
    experiment's bound. An experiment job's bound is
    read from its schedules, and one a search job runs after its searches is bounded at the
    lowest knee it can meet (hosted_seconds), so the limit is a function Snakemake calls
    once the job's inputs exist."""
    from filledfirst.frontier.plan import frontier_plan, frontier_runtime_minutes, paired_check_minutes

    if not job.searches:
        members = [e.experiment for e in job.experiments]
        schedules = [e.schedule for e in job.experiments]
        return {**job_request(study, members),
                "runtime": lambda wildcards, input: within_limit(study, job.name,
                                                                 _runtime_parts(study, members, schedules))}
    searches = [(f"search {s.frontier}/{s.setting}", 60.0 * frontier_runtime_minutes(study, s.frontier))
                for s in job.searches]
    # the paired checks: a searched intervention's after its search, those judged alone after their parent's
    paired = [s for s in job.searches
              if (i := frontier_plan(study, s.frontier).interventions.get(s.setting)) is not None and i.paired]
    searches += [(f"paired check {c.frontier}/{c.setting}", 60.0 * paired_check_minutes(study, c.frontier, c.setting))
                 for c in (*paired, *job.checks)]
    if not job.experiments:
        return {**job_request(study), "runtime": within_limit(study, job.name, searches)}

    def runtime(wildcards, input) -> int:
        hosted = [(e.experiment, hosted_seconds(study, e.experiment, e.trace_csv)) for e in job.experiments]
        return within_limit(study, job.name, searches + hosted)

    return {**job_request(study), "runtime": runtime}
