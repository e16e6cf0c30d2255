"""GPUs for the servers one machine runs at once (filledfirst.engine.devices), with a
stand-in nvidia-smi (this machine has no GPU): each server takes devices no other holds,
gets them as CUDA_VISIBLE_DEVICES, and gives them back when it stops or dies; a server
that cannot have its devices does not start, saying why."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from filledfirst.engine import devices, shared
from filledfirst.engine.server import ServerStartError

from helpers.gpus import install


@pytest.fixture
def gpus(tmp_path, monkeypatch):
    """A machine with `n` GPUs of 80 GB (helpers.gpus)."""
    return lambda n: install(tmp_path, monkeypatch, [81_920] * n)


def test_each_server_takes_devices_no_other_holds(gpus):
    gpus(4)
    one, two = devices.lease(1), devices.lease(2)
    assert one.devices == ["0"] and two.devices == ["1", "2"]
    with pytest.raises(ServerStartError, match=r"needs 2 free GPU\(s\) and 3 of the 4 visible are held"):
        devices.lease(2)
    two.release()
    assert devices.lease(2).devices == ["1", "2"]


def test_a_server_that_died_gives_its_devices_back(gpus, tmp_path):
    gpus(1)
    # another process holds the only GPU, then dies without releasing anything
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, sys, time
        f = open({str(tmp_path / "locks" / "gpu-0.lock")!r}, "w")
        fcntl.flock(f, fcntl.LOCK_EX)
        print("held", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    (tmp_path / "locks").mkdir(exist_ok=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ServerStartError, match="held by other servers"):
            devices.lease(1)
    finally:
        holder.kill()
        holder.wait()
    assert devices.lease(1).devices == ["0"]


def test_the_visible_devices_bound_what_is_leased(gpus, monkeypatch):
    gpus(8)
    monkeypatch.setenv(devices.VISIBLE, "4,5")  # e.g. what a job was given
    assert devices.lease(2).devices == ["4", "5"]
    with pytest.raises(ServerStartError, match=r"needs 3 GPU\(s\) \(tensor_parallel_size\) and this machine shows 2"):
        devices.lease(3)


def test_a_machine_whose_gpus_cannot_be_listed_leaves_them_to_vllm(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi (e.g. a ROCm machine)
    monkeypatch.delenv(devices.VISIBLE, raising=False)
    assert devices.lease(2).devices == []


def test_only_a_gpu_server_outside_a_batch_job_leases(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert devices.leased("gpu", {}) and not devices.leased("cpu", {})
    assert not devices.leased("gpu", {devices.VISIBLE: "1"})  # the user's own choice stands
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert not devices.leased("gpu", {})


def test_two_servers_started_at_once_get_different_gpus(gpus, tmp_path, monkeypatch):
    """Two shared servers (two Snakemake jobs with --resources engine=2) on a machine with
    two GPUs: each starts with its own CUDA_VISIBLE_DEVICES, a tensor-parallel one takes
    two, and a stopped server's devices go to the next. The server itself is a stand-in:
    what is tested is what it is started with."""
    from filledfirst.config import load_config, search_server
    from filledfirst.study import as_study

    from conftest import REPO

    gpus(2)
    started = []

    class StandIn:
        def __init__(self, cmd, **_):
            self.cmd, self.startup_s = cmd, 1.0

        def __enter__(self):
            started.append(self.cmd.env[devices.VISIBLE])
            return self

        def version(self):
            return "stand-in"

        def stop(self):
            pass

    monkeypatch.setattr(shared, "VllmServer", StandIn)
    cfg = load_config([REPO / "config" / "config.yaml"])
    spec = search_server(as_study(cfg), "decode", "default")
    a, b = (shared.SharedServer(spec, tmp_path / f"{name}.log") for name in "ab")
    a._start_on("x", "127.0.0.1", 1)
    b._start_on("y", "127.0.0.1", 2)
    assert started == ["0", "1"]
    with pytest.raises(ServerStartError, match="held by other servers"):
        shared.SharedServer(spec, tmp_path / "c.log")._start_on("z", "127.0.0.1", 3)
    a.stop()
    b.stop()
    wide = spec.__class__(model=spec.model, engine=spec.engine, server={**spec.server, "tensor_parallel_size": 2})
    c = shared.SharedServer(wide, tmp_path / "c.log")
    c._start_on("z", "127.0.0.1", 3)
    assert started[-1] == "0,1" and "--tensor-parallel-size" in c.cmd.argv
