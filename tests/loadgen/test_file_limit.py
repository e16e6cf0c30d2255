"""The client's own open-file limit is never the server's fault.

A replay holds a connection per request in flight. It raises its soft open-file limit
(RLIMIT_NOFILE) to the hard limit before it sends, so at the common soft limit of 1,024
a replay of 1,500 requests in flight at once loses nothing. When even the hard limit is
too low, the requests that found no descriptor are `not_sent` (the server never saw
them), none is counted as failed, and the run is `failed` with the limit and how to
raise it.

Each replay runs as `python -m filledfirst replay` in a process of its own, its limits set
there, so nothing leaks into pytest; the double runs in a process with the most
descriptors the machine allows."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import REPO
from helpers.schedules import probe_schedule

SRC = REPO / "src"
_, HARD = resource.getrlimit(resource.RLIMIT_NOFILE)


class Double:
    """tests/helpers/stream_double.py as a process; `counts()` once it has stopped."""

    def __init__(self, tmp: Path, *args: str):
        self.counts_path = tmp / "double-counts.json"
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "helpers" / "stream_double.py"), "--port", "0", "--emit-log",
             str(tmp / "emit.json"), "--counts", str(self.counts_path), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"

    def stop(self) -> dict:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        return json.loads(self.counts_path.read_text())

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def double_factory(tmp_path):
    made: list[Double] = []

    def make(*args: str) -> Double:
        made.append(Double(tmp_path, *args))
        return made[-1]

    yield make
    for d in made:
        d.kill()


def replay(url: str, sched: Path, out: Path, soft: int, hard: int, *extra: str) -> subprocess.CompletedProcess:
    def limit() -> None:  # in the child only
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "filledfirst", "replay", "--url", url, "--schedule", str(sched), "--out", str(out),
         "--model", "double", "--token-ids", "10", "20", "--no-progress", "--scrape-interval", "1",
         "--request-timeout", "120", *extra],
        preexec_fn=limit, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(HARD < 4096, reason=f"the hard open-file limit here is {HARD}: 1,500 connections need more")
@pytest.mark.parametrize("soft, workers", [(1024, "1"), (512, "2")])  # 750 connections a worker process
def test_1500_requests_held_open_at_once_with_a_soft_limit_of_1024_are_all_ok(tmp_path, double_factory, soft,
                                                                              workers):
    n = 1500
    double = double_factory("--hold-until", str(n), "--ttft-ms", "1", "--itl-ms", "1")
    sched = probe_schedule(tmp_path / "s.parquet", n, gap_s=1.0 / n, prompt=4, output=2)
    proc = replay(double.url, sched, tmp_path / "out", soft, HARD, "--workers", workers)
    counts = double.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((tmp_path / "out" / "run.json").read_text())
    assert meta["status"] == "ok" and meta["request_status_counts"] == {"ok": n}, meta.get("error")
    assert counts["peak_in_flight"] == n  # every request was open at once
    assert counts["requests"] == n


def test_a_hard_limit_too_low_fails_the_run_as_the_clients_fault(tmp_path, double_factory):
    """soft = hard = 64, 100 requests in flight: the client cannot open them all."""
    n, limit = 100, 64
    double = double_factory("--ttft-ms", "2000", "--itl-ms", "1")  # each answer lasts 2 s: all overlap
    sched = probe_schedule(tmp_path / "s.parquet", n, gap_s=0.2 / n, prompt=4, output=2)
    proc = replay(double.url, sched, tmp_path / "out", limit, limit)
    double.stop()
    assert proc.returncode == 1, proc.stderr[-3000:]
    out = tmp_path / "out"
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "failed"
    error = meta["error"]
    assert "the client ran out of file descriptors" in error and f"hard limit {limit}" in error, error
    assert "ulimit -n" in error, error
    counts = meta["request_status_counts"]
    assert set(counts) <= {"ok", "not_sent"} and counts.get("not_sent"), counts  # nothing blamed on the server
    requests = pq.read_table(out / "requests.parquet").to_pylist()
    for r in requests:
        if r["status"] == "not_sent":
            assert r["error"].startswith("the client ran out of file descriptors"), r
            assert r["t_sent"] is None
