"""What a run ran on: versions and hardware, recorded in run.json."""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
import sys

import psutil

import filledfirst
from filledfirst.engine.devices import gpus, in_batch_job
from filledfirst.installed import engine_version, package_version


def source_commit() -> str | None:
    """The git commit the package's source was at, `+dirty` when its tracked files had
    changes; None for an installed copy outside a checkout (or without git): the version
    alone then tells two runs' code apart."""
    return _commit_of(os.path.dirname(os.path.abspath(filledfirst.__file__)))


# Asked once per process (every probe's run.json records it): the code this process
# imported does not change while it runs.
@functools.cache
def _commit_of(src: str) -> str | None:
    git = shutil.which("git")
    if git is None:
        return None
    try:
        # the package's own files tracked there: not a venv inside some other checkout
        subprocess.run([git, "-C", src, "ls-files", "--error-unmatch", "__init__.py"], capture_output=True,
                       timeout=10, check=True)
        head = subprocess.run([git, "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run([git, "-C", src, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (subprocess.SubprocessError, OSError):
        return None
    return f"{head}+dirty" if dirty else head or None


def versions() -> dict:
    return {
        "filledfirst": filledfirst.__version__,
        "filledfirst_commit": source_commit(),
        "python": sys.version.split()[0],
        "vllm_package": engine_version(),
        "torch": package_version("torch"),
        "aiohttp": package_version("aiohttp"),
    }


def hardware() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    job = batch_job()
    return {
        "host": platform.node(),
        "os": platform.platform(),
        "cpu": cpu,
        "cores": psutil.cpu_count(logical=True),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "gpus": _gpus(),
        **({"batch_job": job} if job else {}),
    }


def batch_job() -> dict | None:
    """The SLURM job the run ran in (None outside one, and then not recorded): its id,
    node, CPUs, and the GPUs it was given (CUDA_VISIBLE_DEVICES, which vLLM uses;
    `gpus` lists all of the node's)."""
    env = os.environ
    if not in_batch_job():
        return None
    return {
        "slurm_job_id": env["SLURM_JOB_ID"],
        "node": env.get("SLURMD_NODENAME"),
        "cpus": env.get("SLURM_CPUS_PER_TASK"),
        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
    }


def _gpus() -> list[str]:
    """Every GPU of the machine: index, name, memory, driver. The ones a server used are
    its CUDA_VISIBLE_DEVICES (run.json's server.env; a batch job's, batch_job)."""
    return [f"{g.index}, {g.name}, {g.memory_mib:g} MiB, {g.driver}" for g in gpus()]
