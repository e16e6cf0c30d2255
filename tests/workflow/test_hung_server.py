"""A server that hangs mid-run (every vLLM process stopped with SIGSTOP): the client's
timeouts fire, every request keeps a row, and the run still ends within its bound."""

import json
import os
import signal
import time

import pyarrow.parquet as pq
import pytest
import yaml

from conftest import REPO, build_test_model, with_engine_overlay
from helpers.procs import find_server, group_members, kill_leftovers, start_run, wait_for_finished_requests

pytestmark = pytest.mark.engine

SCHEDULE_S = 10.0
FIRST_TOKEN_TIMEOUT_S = 3.0
DRAIN_TIMEOUT_S = 5.0


def test_a_hung_server_costs_timeouts_not_the_run(tmp_path):
    from filledfirst.workloads.synthetic import write_synthetic_schedule

    cfg = yaml.safe_load((REPO / "tests" / "configs" / "long.yaml").read_text())
    cfg["loadgen"] = {"first_token_timeout_s": FIRST_TOKEN_TIMEOUT_S, "request_timeout_s": 20,
                      "drain_timeout_s": DRAIN_TIMEOUT_S}
    cfg["workloads"]["steady"] = {"kind": "synthetic", "phases": [
        {"role": "decode", "count": 40, "interval_s": SCHEDULE_S / 40, "prompt_tokens": 100, "output_tokens": 16}]}
    cfg["experiments"] = {"hung": {"workload": "steady"}}
    cfg = with_engine_overlay(cfg)
    config = tmp_path / "hung.yaml"
    config.write_text(yaml.safe_dump(cfg))
    build_test_model(tmp_path / "data" / "models" / "tiny-qwen2")
    write_synthetic_schedule(cfg["workloads"]["steady"], tmp_path / "s.parquet")
    out = tmp_path / "results" / "runs" / "hung"
    log_path = tmp_path / "run.log"
    run = start_run(tmp_path, config, "hung", tmp_path / "s.parquet", out, log_path)
    pgid = None
    try:
        server = find_server(tmp_path, log=log_path)
        pgid = os.getpgid(server.pid)
        done_before = wait_for_finished_requests(server, 2)
        os.killpg(pgid, signal.SIGSTOP)  # alive, holding its port, answering nothing
        t_hang = time.monotonic()
        assert run.wait(timeout=120) == 0, log_path.read_text()[-3000:]
        took = time.monotonic() - t_hang
        deadline = time.monotonic() + 10
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not group_members(pgid), "the stopped server must be killed"
    finally:
        kill_leftovers(run, pgid)
    # The rest of the schedule, one first-token timeout, the drain, stopping a stopped
    # server (SIGTERM waits, then SIGKILL): bounded, with room for a loaded machine.
    bound = SCHEDULE_S + FIRST_TOKEN_TIMEOUT_S + DRAIN_TIMEOUT_S + 10 + 15
    assert took < bound, f"the run took {took:.0f} s after the server hung (bound {bound:.0f} s)"

    meta = json.loads((out / "run.json").read_text())
    reqs = pq.read_table(out / "requests.parquet").to_pylist()
    assert len(reqs) == 40  # every scheduled request has a row
    by_status = {}
    for r in reqs:
        by_status.setdefault(r["status"], []).append(r)
    assert by_status.get("ok"), "requests before the hang were measured"
    timed_out = by_status.get("timeout", [])
    # Whatever the CPU's speed: after the stop nothing can finish, so at most the requests
    # done when it came, plus those the server held then (the cap), were answered.
    cap = cfg["engine"]["server"]["max_num_seqs"]
    assert len(by_status["ok"]) <= done_before + cap, {k: len(v) for k, v in by_status.items()}
    assert all(r["error"] for r in timed_out)
    assert set(by_status) <= {"ok", "timeout"}, {k: len(v) for k, v in by_status.items()}
    assert meta["scrape_errors"] > 0  # the scraper saw the hang too
    assert meta["request_status_counts"]["timeout"] == len(timed_out)
