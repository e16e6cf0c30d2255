"""Keep a started server from outliving the pipeline, however the pipeline ends.

Three layers, because each covers a death the others cannot see:
- the server runs in its own process group, stopped as a group (its engine-core
  children included) on every normal or exceptional exit;
- a guardian process holds a pipe from us; when we die, even by SIGKILL, the pipe
  closes and the guardian stops the group;
- an owner watchdog (filledfirst.interrupts): when our parent or the Snakemake process
  running the job dies, we stop as if interrupted, so killing the pipeline kills its
  experiments.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import psutil

from filledfirst.interrupts import set_parent_death_signal

log = logging.getLogger(__name__)

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


def stop_group(pgid: int, grace_s: float = 5.0) -> None:
    """SIGTERM the group, wait, then SIGKILL whatever is left. A paused group (`pause_group`)
    is resumed right after the SIGTERM, which it would otherwise hold pending."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
            os.killpg(pgid, signal.SIGCONT)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not _group_alive(pgid):
                return
            time.sleep(0.1)


def pause_group(pgid: int) -> None:
    """SIGSTOP the group: every process of it stops where it is, using no CPU and keeping
    its memory, sockets and state, until `resume_group`."""
    os.killpg(pgid, signal.SIGSTOP)


def resume_group(pgid: int) -> None:
    os.killpg(pgid, signal.SIGCONT)


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
