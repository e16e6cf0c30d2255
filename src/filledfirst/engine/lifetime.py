"""Keep a started server from outliving the pipeline, however the pipeline ends.

Three layers, because each covers a death the others cannot see:
- the server runs in its own process group, stopped as a group (its engine-core
  children included) on every normal or exceptional exit;
- a guardian process holds a pipe from us; when we die, even by SIGKILL, the pipe
  closes and the guardian stops the group;
- an owner watchdog: when our parent or the Snakemake process running the job dies,
  we stop as if interrupted, so killing the pipeline kills its experiments.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import psutil

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def server_preexec(nice: int):
    """What the server's child process does before exec."""

    def preexec() -> None:
        set_parent_death_signal()
        if nice:
            os.nice(nice)
            # With autogroup scheduling (most desktop and server kernels), nice only
            # weighs processes within one session; the server has its own session, so
            # its whole group is de-prioritised too.
            try:
                with open("/proc/self/autogroup", "w") as f:
                    f.write(str(nice))
            except OSError:
                pass

    return preexec


def set_parent_death_signal() -> None:
    """Run in the child before exec: the kernel kills it when its parent dies."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except OSError:  # not Linux: the guardian still covers it
        pass


def stop_group(pgid: int, grace_s: float = 10.0) -> None:
    """SIGTERM the group, wait, then SIGKILL whatever is left."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not _group_alive(pgid):
                return
            time.sleep(0.1)


def _group_alive(pgid: int) -> bool:
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def start_guardian(pgid: int) -> subprocess.Popen:
    """A watcher in its own session that stops `pgid` once our end of its pipe closes."""
    return subprocess.Popen(
        [sys.executable, "-m", "filledfirst.engine.guardian", str(pgid)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


class Interrupted(Exception):
    """Raised in the main thread on SIGINT/SIGTERM/SIGHUP or when the pipeline died."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


_interrupt_reason: str | None = None


def interrupt_reason() -> str | None:
    return _interrupt_reason


def install_interrupt_handlers() -> None:
    def handler(signum, _frame):
        global _interrupt_reason
        _interrupt_reason = _interrupt_reason or f"received {signal.Signals(signum).name}"
        raise Interrupted(_interrupt_reason)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


WATCH_PID_ENV = "FILLEDFIRST_WATCH_PID"


def watch_owners(interval_s: float = 1.0) -> threading.Thread:
    """SIGTERM ourselves when our parent, or the process named by $FILLEDFIRST_WATCH_PID
    (the Snakefile sets it to the Snakemake process running the job), goes away.

    Not every ancestor: a shell that started the pipeline with `&` and then exited must
    not stop a run that the pipeline still owns.
    """
    me = psutil.Process()
    owners = [me.parent()]
    pid = os.environ.get(WATCH_PID_ENV)
    if pid and pid.isdigit() and int(pid) in {p.pid for p in me.parents()}:
        owners.append(psutil.Process(int(pid)))
    owners = [p for p in owners if p is not None and p.pid > 1]

    def loop() -> None:
        global _interrupt_reason
        while True:
            time.sleep(interval_s)
            for p in owners:
                if not p.is_running():  # also false if the pid was reused
                    _interrupt_reason = f"process {p.pid} ({p.name()}) that owns this run exited"
                    log.warning("%s: stopping", _interrupt_reason)
                    os.kill(os.getpid(), signal.SIGTERM)
                    return

    thread = threading.Thread(target=loop, name="owner-watchdog", daemon=True)
    thread.start()
    return thread
