"""A one-node SLURM cluster on this machine, for tests.

munged, slurmctld and slurmd run in the foreground as children of the test, with their
own munge key and socket, loopback ports, state, spool and logs in one folder, so
nothing of the machine's own set-up (/etc/slurm, /etc/munge, /run/munge) is used or
changed. Clients find it through SLURM_CONF (`env()`).

Debian's slurm-wlm 22.05 has no accounting without slurmdbd (and slurmdbd needs a
MySQL server): `sacct` only says "Slurm accounting storage is disabled". So job states
come from `squeue --states=all`, which lists finished jobs until MinJobAge has passed
(set long here), and every finished job is written to a plain-text job-completion log
(jobcomp/filetxt, `completed_jobs()`).

Inside a job, the Snakemake SLURM plugin's job step (snakemake-executor-plugin-slurm-
jobstep) starts the rule with `srun` after removing every SLURM_* variable but the job's
identity, SLURM_CONF included (its issues #164 and #334), so a client that finds its
cluster through SLURM_CONF, as here, loses it. Real clusters have /etc/slurm/slurm.conf
(or configless slurmd); this one, which must not touch /etc, puts an `srun` first on
PATH that sets SLURM_CONF again.

Needs root (slurmd runs jobs as their user, munged and slurmctld as root here) and
Debian's slurm-wlm and munge (`make test` installs them).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scancel", "scontrol", "sinfo")
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
NODE = "ffnode"
CLUSTER = "filledfirst"
# Finished jobs stay in squeue this long (the SLURM plugin's squeue status needs at
# least three times its first status check, 40 s by default).
MIN_JOB_AGE_S = 3600


def missing_requirements() -> str | None:
    """Why a cluster cannot be started here, or None."""
    missing = [b for b in DAEMONS + CLIENTS if shutil.which(b, path=SEARCH_PATH) is None]
    if missing:
        return (
            f"SLURM test cluster: {', '.join(missing)} not found; install Debian's slurm-wlm and munge "
            "(apt-get install slurm-wlm munge; `make test` does it when run as root)"
        )
    if os.geteuid() != 0:
        return "SLURM test cluster: slurmd and munged must run as root here; run the tests as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(none)"


class SlurmCluster:
    """`with SlurmCluster(folder) as cluster:` starts it and always tears it down."""

    def __init__(self, root: Path, *, cpus: int = 2, memory_mb: int | None = None):
        self.root = Path(root)
        self.cpus = cpus
        total_mb = psutil.virtual_memory().total // 2**20
        self.memory_mb = memory_mb or int(min(total_mb * 3 // 4, 16384))
        # Unix socket paths are limited to 107 bytes: keep munge's in a short folder.
        self._sock_dir = Path(tempfile.mkdtemp(prefix="ffmunge-", dir="/tmp"))
        self.conf = self.root / "slurm.conf"
        self.logs = self.root / "logs"
        self.jobcomp = self.logs / "jobcomp.txt"
        self.procs: dict[str, subprocess.Popen] = {}

    # -- start -----------------------------------------------------------------

    def __enter__(self) -> "SlurmCluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def env(self, base: dict | None = None) -> dict:
        """An environment whose SLURM commands talk to this cluster (jobs inherit it)."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        env["PATH"] = os.pathsep.join([str(self.root / "bin"), env.get("PATH", ""), "/usr/sbin", "/sbin"])
        return env

    def start(self) -> None:
        for sub in ("state", "spool", "logs", "bin"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        srun = self.root / "bin" / "srun"
        srun.write_text(f'#!/bin/sh\nSLURM_CONF={self.conf} exec {shutil.which("srun", path=SEARCH_PATH)} "$@"\n')
        srun.chmod(0o755)
        self._start_munge()
        self._write_conf()
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._spawn("slurmd", ["slurmd", "-D", "-N", NODE, "-f", str(self.conf)])
        self._wait(lambda: self._node_state() == "idle", 60, "the node to come up idle")

    def _start_munge(self) -> None:
        key = self._sock_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._sock_dir.chmod(0o755)
        self.munge_socket = self._sock_dir / "munge.socket"
        self._spawn("munged", [
            "munged", "--foreground", "--force",
            f"--key-file={key}", f"--socket={self.munge_socket}",
            f"--pid-file={self._sock_dir / 'munged.pid'}", f"--seed-file={self._sock_dir / 'munged.seed'}",
            f"--log-file={self.logs / 'munged.log'}",
        ])
        self._wait(self.munge_socket.exists, 20, "munged's socket")

    def _write_conf(self) -> None:
        host = socket.gethostname().split(".")[0]
        r = self.root
        (r / "plugstack.conf").write_text("")
        self.conf.write_text(f"""\
ClusterName={CLUSTER}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={r / 'spool'}
SlurmctldPidFile={r / 'slurmctld.pid'}
SlurmdPidFile={r / 'slurmd.pid'}
SlurmctldLogFile={self.logs / 'slurmctld.log'}
SlurmdLogFile={self.logs / 'slurmd.log'}
PlugStackConfig={r / 'plugstack.conf'}
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
MpiDefault=none
SchedulerType=sched/backfill
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={self.jobcomp}
MinJobAge={MIN_JOB_AGE_S}
KillWait=10
MessageTimeout=30
InactiveLimit=0
NodeName={NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.logs / f"{name}.out", "ab")
        try:
            argv = [shutil.which(argv[0], path=SEARCH_PATH), *argv[1:]]
            self.procs[name] = subprocess.Popen(
                argv, env=self.env(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        finally:
            out.close()

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"SLURM test cluster: {', '.join(dead)} exited while waiting for {what}\n"
                                   + self.diagnostics())
            if ready():
                return
            time.sleep(0.5)
        raise RuntimeError(f"SLURM test cluster: no {what} after {timeout_s:.0f} s\n" + self.diagnostics())

    def diagnostics(self) -> str:
        return "\n".join(
            f"--- {f.name}:\n{_tail(f)}" for f in sorted(self.logs.glob("*")) if f.is_file()
        )

    # -- queries ---------------------------------------------------------------

    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=timeout, check=check)

    def _node_state(self) -> str | None:
        try:
            return self.run("sinfo", "--noheader", "--Node", "--format=%T", check=False).stdout.strip() or None
        except subprocess.TimeoutExpired:
            return None

    def jobs(self) -> list[dict]:
        """Every job slurmctld still knows (finished ones for MinJobAge), as squeue sees it:
        id, state, comment, CPUs, memory, time limit and what it asked for per node (TRES,
        where a GPU request shows as gres/gpu)."""
        fields = ["id", "state", "comment", "cpus", "memory", "time_limit", "tres_per_node", "name"]
        out = self.run("squeue", "--states=all", "--noheader",
                       "--format=%i|%T|%k|%C|%m|%l|%b|%j").stdout
        return [dict(zip(fields, line.split("|"))) for line in out.splitlines() if line.strip()]

    def completed_jobs(self) -> list[dict]:
        """The job-completion log: one `key=value ...` record per finished job."""
        if not self.jobcomp.is_file():
            return []
        records = []
        for line in self.jobcomp.read_text().splitlines():
            rec = {}
            for field in line.split():
                key, _, value = field.partition("=")
                rec[key] = value
            if rec:
                records.append(rec)
        return records

    # -- tear-down -------------------------------------------------------------

    def ours(self) -> list[psutil.Process]:
        """Processes of this cluster outside the three daemons: job steps and whatever
        the jobs started (vLLM included), found by this cluster's SLURM_CONF in their
        environment (jobs inherit it from sbatch --export=ALL, slurmstepd from slurmd)."""
        mark = f"SLURM_CONF={self.conf}".encode()
        me = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
        daemons = {p.pid for p in self.procs.values()}
        found = []
        for pid in psutil.pids():
            if pid in me or pid in daemons:
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if mark in f.read().split(b"\0"):
                        found.append(psutil.Process(pid))
            except (OSError, psutil.Error):
                pass
        return found

    def stop(self) -> list[str]:
        """Cancel every job, stop the daemons, then kill (by pid) anything of the cluster
        still alive. Returns what had to be killed that way. Safe to call twice."""
        killed: list[str] = []
        if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
            try:
                self.run("scancel", "--full", f"--user={os.getuid()}", check=False)
                deadline = time.monotonic() + 40
                while time.monotonic() < deadline and any(
                    j["state"] in ("RUNNING", "PENDING", "COMPLETING", "CONFIGURING") for j in self.jobs()
                ):
                    time.sleep(1)
            except (subprocess.SubprocessError, OSError):
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        leftovers = self.ours()
        for p in leftovers:
            try:
                killed.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(leftovers, timeout=10)
        shutil.rmtree(self._sock_dir, ignore_errors=True)
        return killed
