"""What an experiment job asks a batch system for: GPUs, CPUs, memory and a time limit.

One job per server group (Snakemake rule `run_group_<name>`): one vLLM start, then the
group's experiments one after the other. The SLURM profile (config/profiles/slurm) turns
these resources into sbatch options; a local run ignores them. Defaults are the schema's
(`cluster` in workflow/schemas/config.schema.yaml).

The time limit is the longest the job can legitimately take by the runner's own limits:
the server start-up (it gives up after `engine.startup_timeout_s`), then for each
experiment its last scheduled arrival plus the drain after it (the client cancels what
is still running `loadgen.drain_timeout_s` after its last send). A job SLURM stops at
its limit fails with every experiment it had not finished, so the estimate errs on the
long side; `cluster.startup_allowance_s` and `cluster.drain_allowance_s` tighten it.
"""

from __future__ import annotations

import errno
import math
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from filledfirst.config import deep_merge, external_server

DEFAULT_CPUS = 8
DEFAULT_MEM_MB = 65536


def gpus_per_job(cfg: dict) -> int:
    """`cluster.gpus_per_job`, else one GPU for the gpu launcher and none for the cpu one."""
    cluster = cfg.get("cluster", {})
    if "gpus_per_job" in cluster:
        return int(cluster["gpus_per_job"])
    return 1 if cfg["engine"]["launcher"] == "gpu" else 0


def job_request(cfg: dict, members: list[str] | None = None) -> dict[str, int | str]:
    """The fixed part of an experiment job's resources, in the SLURM plugin's names:
    `gpu` (sbatch --gpus), `gpu_model` (--gpus=MODEL:N), `cpus_per_task`, `mem_mb`.
    A job that replays against an external endpoint (`server.url`) starts no server and
    asks for no GPU."""
    cluster = cfg.get("cluster", {})
    external = bool(members) and all(external_server(cfg, e) for e in members)
    out: dict[str, int | str] = {
        "gpu": 0 if external else gpus_per_job(cfg),
        "cpus_per_task": int(cluster.get("cpus_per_job", DEFAULT_CPUS)),
        "mem_mb": int(cluster.get("mem_mb", DEFAULT_MEM_MB)),
    }
    if out["gpu"] and cluster.get("gpu_model"):
        out["gpu_model"] = str(cluster["gpu_model"])
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


def experiment_seconds(cfg: dict, experiment: str, schedule: str | Path) -> float:
    """Upper bound of one experiment's time on an already running server."""
    exp = cfg["experiments"][experiment]
    loadgen = deep_merge(cfg.get("loadgen", {}), exp.get("loadgen", {}))
    drain = cfg.get("cluster", {}).get("drain_allowance_s", loadgen.get("drain_timeout_s", 600))
    # A closed loop ignores the arrival times: its requests follow one another as fast as
    # the server answers, which the drain allowance covers.
    span = 0.0 if loadgen.get("mode", "open") == "closed" else last_arrival_s(schedule)
    return span + float(drain)


def runtime_minutes(cfg: dict, members: list[str], schedules: list[str | Path]) -> int:
    """The time limit of the job running `members` (in order, one schedule each), in
    whole minutes: one server start-up, then every experiment's bound."""
    if len(members) != len(schedules):
        raise ValueError(f"{len(members)} experiments but {len(schedules)} schedules")
    startup = cfg.get("cluster", {}).get("startup_allowance_s", cfg["engine"].get("startup_timeout_s", 600))
    if all(external_server(cfg, e) for e in members):
        startup = 0  # nothing to start
    total = float(startup) + sum(experiment_seconds(cfg, e, s) for e, s in zip(members, schedules))
    return max(1, math.ceil(total / 60))
