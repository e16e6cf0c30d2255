"""Finding the vLLM processes a test started, to kill or inspect them."""

import os
import subprocess
import sys
import time

import psutil


def find_server(workdir, timeout_s=400, log=None):
    """The api_server started in this workdir, once its replay has begun (as `log` says)."""
    log = log or workdir / "results" / "logs" / "run-long_run.log"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.is_file() and "replaying" in log.read_text():
            for p in psutil.process_iter(["cmdline", "cwd"]):
                if "vllm.entrypoints.openai.api_server" in (p.info["cmdline"] or []) and p.info["cwd"] == str(workdir):
                    return p
        time.sleep(0.5)
    raise AssertionError(f"the server never started replaying; log:\n{log.read_text() if log.is_file() else '(none)'}")


def group_members(pgid):
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.Error):
            pass
    return out


def guardians_of(pgid):
    return [p for p in psutil.process_iter(["cmdline"])
            if "filledfirst.engine.guardian" in (p.info["cmdline"] or []) and str(pgid) in p.info["cmdline"]]


def start_run(workdir, config, experiment, schedule, out, log_path) -> subprocess.Popen:
    """`filledfirst run` of one experiment, in `workdir`, its output going to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "filledfirst", "run", "--config", str(config), "--experiment", experiment,
             "--schedule", str(schedule), "--out", str(out), "--no-progress"],
            cwd=workdir, stdout=log, stderr=subprocess.STDOUT,
        )


def kill_leftovers(run: subprocess.Popen, pgid: int | None) -> None:
    """A failed test must never leak its run or its server."""
    if run.poll() is None:
        run.kill()
    if pgid is not None:
        for p in group_members(pgid):
            p.kill()
