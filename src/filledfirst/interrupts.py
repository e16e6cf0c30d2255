"""How a run learns it must stop: SIGINT, SIGTERM or SIGHUP, or the death of the process
that owns it (its parent, or the Snakemake process running the job). Library code notes
the reason and raises `Interrupted`; the runner keeps what was measured and raises it on,
and the command line exits 130 for it.
Shared by the load generator and the engine's lifetime (neither imports the other).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
import time

import psutil

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
# Loaded here, in the parent: dlopen after fork in a threaded process can deadlock.
try:
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:  # not Linux: the guardian and the pipes still cover it
    _LIBC = None


def set_parent_death_signal() -> None:
    """In a child (vLLM before exec, a replay worker): the kernel kills it when its parent dies."""
    if _LIBC is not None and hasattr(_LIBC, "prctl"):
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Interrupted(Exception):
    """Raised in the main thread on SIGINT/SIGTERM/SIGHUP or when the pipeline died."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


_interrupt_reason: str | None = None


def interrupt_reason() -> str | None:
    return _interrupt_reason


_watchdog_reason: str | None = None


def signal_reason(signum: int) -> str:
    """Why a stop signal came: the watchdog's finding when it sent it, else the signal."""
    return _watchdog_reason or f"received {signal.Signals(signum).name}"


def note_interrupt(reason: str) -> None:
    """Record that the run is stopping; later signals then no longer interrupt cleanup."""
    global _interrupt_reason
    _interrupt_reason = _interrupt_reason or reason


def install_interrupt_handlers() -> None:
    def handler(signum, _frame):
        name = signal.Signals(signum).name
        if _interrupt_reason is not None:
            # Already stopping: a second Ctrl-C must not cut the cleanup short (the server
            # stop and the run folder). The guardian covers a SIGKILL.
            log.warning("received %s while stopping (%s); still cleaning up", name, _interrupt_reason)
            return
        note_interrupt(signal_reason(signum))
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
    parent_pid = os.getppid()
    owners = {parent_pid: me.parent().name() if me.parent() else "parent"}
    pid = os.environ.get(WATCH_PID_ENV)
    if pid and pid.isdigit() and int(pid) in {p.pid for p in me.parents()}:
        owners[int(pid)] = psutil.Process(int(pid)).name()
    handles = {pid: psutil.Process(pid) for pid in owners if pid > 1}

    def gone(pid: int) -> bool:
        if pid == parent_pid and os.getppid() != parent_pid:
            return True  # reparented: the parent died and was reaped
        try:
            # A killed owner whose own parent has not reaped it yet is a zombie: gone too.
            return not handles[pid].is_running() or handles[pid].status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    def loop() -> None:
        while True:
            time.sleep(interval_s)
            try:
                dead = next((pid for pid in handles if gone(pid)), None)
            except psutil.Error as exc:  # never let the watchdog die silently
                log.warning("owner watchdog: %s", exc)
                continue
            if dead is not None:
                global _watchdog_reason
                _watchdog_reason = f"process {dead} ({owners[dead]}) that owns this run exited"
                log.warning("%s: stopping", _watchdog_reason)
                os.kill(os.getpid(), signal.SIGTERM)  # handled like any interruption
                return

    thread = threading.Thread(target=loop, name="owner-watchdog", daemon=True)
    thread.start()
    return thread
