"""GPUs for the servers one machine runs at once (`--resources engine=2` on a workstation
with two cards): each start of a gpu-launcher server takes the devices it needs
(tensor_parallel_size, else one) that no other server of this user on this machine holds,
by a lock file per device held while the server runs (the kernel lets it go when the
process dies, however it dies), and starts with CUDA_VISIBLE_DEVICES set to them: two
servers never share a card by accident.

Nothing is leased inside a batch job (SLURM sets CUDA_VISIBLE_DEVICES to the job's own
allocation), nor where engine.env sets CUDA_VISIBLE_DEVICES itself."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from filledfirst.engine.server import ServerStartError

VISIBLE = "CUDA_VISIBLE_DEVICES"
# The launchers whose servers run on GPUs.
GPU_LAUNCHERS = ("gpu", "sglang")


def lock_dir() -> Path:
    """One per user and machine: every pipeline of this user sees the same locks."""
    return Path(tempfile.gettempdir()) / f"filledfirst-gpus-{os.getuid()}"


@dataclass(frozen=True)
class Gpu:
    index: str
    name: str
    memory_mib: float
    driver: str


def gpus() -> list[Gpu]:
    """Every GPU nvidia-smi lists (none without it, or where it fails): what a start leases
    from, what a KV budget is checked against, and what run.json records."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=index,name,memory.total,driver_version",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10,
                             check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    found = []
    for line in out.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 4 and parts[2].replace(".", "", 1).isdigit():
            found.append(Gpu(parts[0], parts[1], float(parts[2]), parts[3]))
    return found


def visible_devices() -> list[str]:
    """The devices this process may use: CUDA_VISIBLE_DEVICES where set, else every GPU
    nvidia-smi lists (by index); none without either."""
    if os.environ.get(VISIBLE) is not None:
        return [d.strip() for d in os.environ[VISIBLE].split(",") if d.strip()]
    return [g.index for g in gpus()]


def memory(devices: list[str]) -> tuple[str, float] | None:
    """The smallest of `devices` (indices): its name and memory in bytes; None where
    nvidia-smi cannot say."""
    cards = [g for g in gpus() if g.index in devices]
    if not cards:
        return None
    card = min(cards, key=lambda g: g.memory_mib)
    return f"GPU {card.index} ({card.name})", card.memory_mib * 2**20


@dataclass
class Lease:
    """Devices held for one server: released by `release`, or by the process ending."""

    devices: list[str]
    _files: list[IO] = field(default_factory=list, repr=False)

    def release(self) -> None:
        for f in self._files:
            f.close()
        self._files.clear()


def lease(n: int, where: Path | None = None) -> Lease:
    """`n` devices no other server of this user holds; ServerStartError, with what is
    visible and held, when there are not that many free. None listed (no nvidia-smi and no
    CUDA_VISIBLE_DEVICES, e.g. a ROCm machine): an empty lease, the devices left to vLLM."""
    devices = visible_devices()
    if not devices:
        return Lease([])
    if len(devices) < n:
        raise ServerStartError(f"a server needs {n} GPU(s) (tensor_parallel_size) and this machine shows "
                               f"{len(devices)} ({VISIBLE} or nvidia-smi)")
    where = where or lock_dir()
    where.mkdir(parents=True, exist_ok=True)
    held = Lease([])
    busy = []
    for device in devices:
        f = open(where / f"gpu-{device}.lock", "w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            busy.append(device)
            continue
        held.devices.append(device)
        held._files.append(f)
        if len(held.devices) == n:
            return held
    held.release()
    raise ServerStartError(f"a server needs {n} free GPU(s) and {len(busy)} of the {len(devices)} visible are held by "
                           f"other servers ({', '.join(busy)}): run fewer at once (--resources engine=N with N "
                           "servers' GPUs at most)")


def needed(settings: dict) -> int:
    """The devices a server of these vLLM settings takes."""
    return int(settings.get("tensor_parallel_size") or 1)


def in_batch_job() -> bool:
    """Inside a SLURM job, whose allocation is its own (CUDA_VISIBLE_DEVICES set by SLURM)."""
    return "SLURM_JOB_ID" in os.environ


def leased(launcher: str, engine_env: dict[str, str]) -> bool:
    """Whether a server's start leases its devices here (see the module's docstring)."""
    return launcher in GPU_LAUNCHERS and VISIBLE not in engine_env and not in_batch_job()
