"""Killing the pipeline while vLLM runs leaves no vLLM process behind."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from conftest import REPO, snakemake_argv

pytestmark = pytest.mark.engine


def find_server(workdir, timeout_s=400):
    """The api_server started in this workdir, once its replay has begun."""
    log = workdir / "results" / "logs" / "run-long_run.log"
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


@pytest.mark.parametrize("how", ["sigint_group", "sigkill_parent"])
def test_no_vllm_survives_the_pipeline(tmp_path, how):
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"}
    pipeline = subprocess.Popen(
        snakemake_argv(tmp_path, REPO / "tests" / "configs" / "long.yaml", "results/runs/long_run"),
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,  # like a terminal's foreground job
    )
    pgid = None
    try:
        server = find_server(tmp_path)
        pgid = os.getpgid(server.pid)
        assert pgid == server.pid, "vLLM must lead its own process group"
        assert len(group_members(pgid)) >= 2  # api server and its engine core
        if how == "sigint_group":
            os.killpg(pipeline.pid, signal.SIGINT)  # Ctrl-C in the terminal
        else:
            pipeline.kill()  # SIGKILL to Snakemake alone: nothing gets a chance to clean up
        deadline = time.monotonic() + 10
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [" ".join(p.cmdline()) for p in group_members(pgid)]
        assert not left, f"vLLM processes left 10 s after {how}: {left}"
        deadline = time.monotonic() + 5  # the run closes the guardian's pipe after the stop
        while guardians_of(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not guardians_of(pgid), "the guardian must exit once the server is gone"
    finally:
        if pipeline.poll() is None:
            os.killpg(pipeline.pid, signal.SIGKILL)
        pipeline.wait()
        if pgid is not None:  # never leak a server from a failed test
            for p in group_members(pgid):
                p.kill()


def test_server_killed_mid_run_keeps_what_was_measured(tmp_path):
    """vLLM dies mid-replay: in-flight requests become failed rows, the rest `not_sent`,
    the folder is complete and marked partial, and the run ends at once."""
    import json

    import pyarrow.parquet as pq

    from filledfirst.model.tiny import build_tiny_model
    from filledfirst.workloads.synthetic import write_synthetic_schedule
    from filledfirst.config import load_config

    cfg_path = REPO / "tests" / "configs" / "long.yaml"
    build_tiny_model(tmp_path / "data" / "models" / "tiny-qwen2")
    cfg = load_config([cfg_path])
    write_synthetic_schedule(cfg["workloads"]["endless"], tmp_path / "s.parquet")
    out = tmp_path / "results" / "runs" / "long_run"
    (tmp_path / "results" / "logs").mkdir(parents=True)
    log = open(tmp_path / "results" / "logs" / "run-long_run.log", "w")
    run = subprocess.Popen(
        [sys.executable, "-m", "filledfirst", "run", "--config", str(cfg_path), "--experiment", "long_run",
         "--schedule", str(tmp_path / "s.parquet"), "--out", str(out), "--no-progress"],
        cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
    )
    pgid = None
    try:
        server = find_server(tmp_path)
        pgid = os.getpgid(server.pid)
        time.sleep(3)  # some requests done, some in flight
        os.killpg(pgid, signal.SIGKILL)
        t_kill = time.monotonic()
        assert run.wait(timeout=60) == 0
        assert time.monotonic() - t_kill < 15, "the run must end soon after the server died"
    finally:
        if run.poll() is None:
            run.kill()
        if pgid is not None:
            for p in group_members(pgid):
                p.kill()
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "partial" and "vLLM exited during the run" in meta["error"]
    reqs = pq.read_table(out / "requests.parquet").to_pylist()
    statuses = {r["status"] for r in reqs}
    assert len(reqs) == 3000  # every scheduled request has a row
    assert "ok" in statuses and "not_sent" in statuses
    assert statuses <= {"ok", "disconnected", "not_sent"}, statuses
    assert pq.read_table(out / "samples.parquet").num_rows > 0
