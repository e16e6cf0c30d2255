"""A paused server's process group (filledfirst.engine.lifetime.pause_group): it uses no CPU
while paused, runs on when resumed, and is stopped like a running one, by its own SIGTERM
handler, whether our process stops it or the guardian does after we died. A plain Python
group stands in for a server: the thing under test is the signalling."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from filledfirst.engine.lifetime import pause_group, resume_group, start_guardian, stop_group

# Counts in a file as it runs; on SIGTERM writes "term" and exits (a server shutting down).
CHILD = """
import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
signal.signal(signal.SIGTERM, lambda *_: (out.with_suffix(".term").write_text("term"), sys.exit(0)))
n = 0
while True:
    n += 1
    out.write_text(str(n))
    time.sleep(0.02)
"""


def _group(tmp_path) -> tuple[subprocess.Popen, object]:
    count = tmp_path / "count"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(count)], start_new_session=True)
    deadline = time.monotonic() + 30
    while not count.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert count.exists(), "the stand-in never started"
    return proc, count


def _stays(count, seconds: float) -> bool:
    before = count.read_text()
    time.sleep(seconds)
    return count.read_text() == before


def test_a_paused_group_stands_still_and_runs_on_when_resumed(tmp_path):
    proc, count = _group(tmp_path)
    try:
        pause_group(proc.pid)
        deadline = time.monotonic() + 10  # the signal is delivered, not waited for
        while psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
            time.sleep(0.05)
        assert psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED
        assert _stays(count, 0.5)
        resume_group(proc.pid)
        assert not _stays(count, 0.5)
    finally:
        stop_group(proc.pid)
        proc.wait(timeout=10)


def test_a_paused_group_is_stopped_by_its_sigterm_not_left_for_sigkill(tmp_path):
    proc, count = _group(tmp_path)
    pause_group(proc.pid)
    stop_group(proc.pid, grace_s=30)
    assert proc.wait(timeout=10) == 0  # its handler's exit, not -SIGKILL
    assert count.with_suffix(".term").read_text() == "term"


def test_the_guardian_stops_a_paused_group_when_we_die(tmp_path):
    proc, count = _group(tmp_path)
    guardian = start_guardian(proc.pid)
    pause_group(proc.pid)
    guardian.stdin.close()  # what our death does to its pipe
    assert guardian.wait(timeout=30) == 0
    assert proc.wait(timeout=10) == 0
    assert count.with_suffix(".term").read_text() == "term"
