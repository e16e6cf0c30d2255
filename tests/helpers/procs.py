"""Finding the vLLM processes a test started, to kill or inspect them."""

import os
import subprocess
import sys
import time
import urllib.request

import psutil

from filledfirst.metrics import parse_metrics

from conftest import engine_overlay_files


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


def wait_for_finished_requests(server, n, timeout_s=120) -> float:
    """Until the server's own counter shows at least `n` requests done, however fast or
    slow the machine; returns the count it saw."""
    port = server.cmdline()[server.cmdline().index("--port") + 1]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                samples = parse_metrics(resp.read().decode(), 0.0)
            done = sum(s.value for s in samples if s.metric == "vllm:request_success_total")
            if done >= n:
                return done
        except OSError:
            pass
        time.sleep(0.25)
    raise AssertionError(f"fewer than {n} requests finished in {timeout_s} s")


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
        overlay = [arg for f in engine_overlay_files() for arg in ("--config", str(f))]
        return subprocess.Popen(
            [sys.executable, "-m", "filledfirst", "run", "--config", str(config), *overlay, "--experiment", experiment,
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
