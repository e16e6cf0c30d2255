"""Killing the pipeline while vLLM runs leaves no vLLM process behind."""

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, build_test_model, snakemake_argv
from helpers.procs import (
    find_server,
    group_members,
    guardians_of,
    kill_leftovers,
    start_run,
    wait_for_finished_requests,
)

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("how", ["sigint_group", "sigterm_group", "sigkill_parent"])
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
        elif how == "sigterm_group":
            os.killpg(pipeline.pid, signal.SIGTERM)  # scancel, timeout(1), systemd
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

    from filledfirst.config import load_config
    from filledfirst.workloads.synthetic import write_synthetic_schedule

    cfg_path = REPO / "tests" / "configs" / "long.yaml"
    build_test_model(tmp_path / "data" / "models" / "tiny-qwen2")
    cfg = load_config([cfg_path])
    write_synthetic_schedule(cfg["workloads"]["endless"], tmp_path / "s.parquet")
    out = tmp_path / "results" / "runs" / "long_run"
    run = start_run(tmp_path, cfg_path, "long_run", tmp_path / "s.parquet", out,
                    tmp_path / "results" / "logs" / "run-long_run.log")
    pgid = None
    try:
        server = find_server(tmp_path)
        pgid = os.getpgid(server.pid)
        # some requests done, most of the 10-minute schedule still to come
        wait_for_finished_requests(server, 2)
        os.killpg(pgid, signal.SIGKILL)
        t_kill = time.monotonic()
        assert run.wait(timeout=60) == 0
        assert time.monotonic() - t_kill < 15, "the run must end soon after the server died"
    finally:
        kill_leftovers(run, pgid)
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "partial" and "vLLM exited during the run" in meta["error"]
    reqs = pq.read_table(out / "requests.parquet").to_pylist()
    statuses = {r["status"] for r in reqs}
    assert len(reqs) == 3000  # every scheduled request has a row
    assert "ok" in statuses and "not_sent" in statuses
    assert statuses <= {"ok", "disconnected", "not_sent"}, statuses
    assert pq.read_table(out / "samples.parquet").num_rows > 0


def test_a_rerun_after_an_interruption_redoes_only_the_unfinished(tmp_path):
    """Two experiments share a server (one Snakemake job). Ctrl-C during the second: its
    folder is marked partial (Snakemake marks both incomplete), and a plain re-run (the
    workflow profile says --rerun-incomplete) restores the finished first experiment
    instead of measuring it again."""
    import json

    import yaml

    cfg = yaml.safe_load((REPO / "tests" / "configs" / "long.yaml").read_text())
    cfg["workloads"]["quick"] = {"kind": "synthetic", "phases": [
        {"role": "decode", "count": 10, "interval_s": 0.3, "prompt_tokens": 100, "output_tokens": 16}]}
    cfg["experiments"] = {"first": {"workload": "quick"}, "second": {"workload": "endless"}}
    config = tmp_path / "resume.yaml"
    config.write_text(yaml.safe_dump(cfg))
    targets = ("results/runs/first", "results/runs/second")
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = tmp_path / "results" / "logs" / "run-first.log"
    pipeline = subprocess.Popen(snakemake_argv(tmp_path, config, *targets), env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:  # wait until the second experiment is replaying
            if log.is_file() and log.read_text().count("replaying") == 2:
                break
            time.sleep(0.5)
        else:
            raise AssertionError("the second experiment never started; log:\n"
                                 + (log.read_text() if log.is_file() else ""))
        time.sleep(2)
        os.killpg(pipeline.pid, signal.SIGINT)
        assert pipeline.wait(timeout=60) != 0
    finally:
        if pipeline.poll() is None:
            os.killpg(pipeline.pid, signal.SIGKILL)
            pipeline.wait()
    runs = tmp_path / "results" / "runs"
    first = json.loads((runs / ".finished" / "first" / "run.json").read_text())
    assert first["status"] == "ok"
    for folder in runs.iterdir():  # only what really finished looks finished
        meta = json.loads((folder / "run.json").read_text()) if (folder / "run.json").is_file() else {}
        if folder.name in ("first", ".finished"):
            assert folder.name == ".finished" or meta["run_id"] == first["run_id"]
        else:
            assert meta.get("status") != "ok", f"{folder} looks complete after the interruption"

    cfg["experiments"]["second"]["workload"] = "quick"  # the re-run finishes quickly
    config.write_text(yaml.safe_dump(cfg))
    done = subprocess.run(snakemake_argv(tmp_path, config, *targets), env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((runs / "first" / "run.json").read_text())["run_id"] == first["run_id"]
    second = json.loads((runs / "second" / "run.json").read_text())
    # second meets a server that has just served first (replayed unrecorded), as it did
    # before the interruption
    assert second["status"] == "ok" and second["server"]["warmed_up_by"] == "first"
    assert second["server"]["started_by"] == "first" and "startup_reused_s" in second["timings"]
    assert "reusing the run measured before the job was interrupted" in log.read_text()
    assert "replaying it unrecorded" in log.read_text()
    assert not (runs / ".finished").exists()
