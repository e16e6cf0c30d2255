"""A dead endpoint is an error, not a result; a run whose every request failed is not `ok`.

`filledfirst replay` asks the endpoint (/v1/models, with the key) before the schedule
starts and exits non-zero in a second with one line saying why; a `server.url`
experiment of the pipeline gets a `failed` run folder instead, kept like one whose
server did not start. A run in which every sent request failed is `failed`, with the
commonest error, through run.json, the database, the diagnosis and the report."""

from __future__ import annotations

import copy
import json
import socket
import time

import duckdb
import pytest

from filledfirst import cli
from filledfirst.analysis import signals
from filledfirst.analysis.diagnosis import write_diagnosis
from filledfirst.config import load_config, validate_config
from filledfirst.contracts.records import RequestRecord
from filledfirst.loadgen.endpoint import EndpointError, check_endpoint
from filledfirst.report import tables
from filledfirst.report.rows import RunRow
from filledfirst.run.runner import Job, every_request_failed, run_experiments
from filledfirst.store.ingest import ingest
from filledfirst.study import DiagnosisRules, as_study

from conftest import REPO
from helpers.schedules import probe_schedule
from helpers.stream_double import Answer, StreamDouble

KEY = "sk-planted-dead-endpoint-81c3"  # must never reach a message or a file


def closed_port() -> int:
    """A loopback port nothing listens on: bound once, then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def replay(capsys, url, tmp_path, *extra) -> tuple[int, str, float]:
    argv = ["replay", "--url", url, "--schedule", str(probe_schedule(tmp_path / "s.parquet", n=8)),
            "--out", str(tmp_path / "out"), "--model", "double", "--token-ids", "10", "20", "--no-progress",
            "--scrape-interval", "0.2", *extra]
    t0 = time.monotonic()
    code = cli.main(argv)
    return code, capsys.readouterr().err, time.monotonic() - t0


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("filledfirst: error:")]


@pytest.mark.parametrize("port", [1, None])
def test_replay_against_a_closed_port_fails_at_once_with_one_line(capsys, tmp_path, port):
    url = f"http://127.0.0.1:{port or closed_port()}"
    code, err, elapsed = replay(capsys, url, tmp_path)
    assert code != 0
    assert error_lines(err) == [f"filledfirst: error: cannot reach {url}: connection refused "
                                "(is the server running, on this host and port?)"]
    assert elapsed < 5  # not the schedule, nor a timeout
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))  # nothing written


def test_the_check_sends_the_key_and_says_when_it_is_refused_or_missing(capsys, tmp_path, monkeypatch):
    double = StreamDouble(api_key=KEY)
    with double.serving_in_thread() as base:
        check_endpoint(base, KEY)  # the right key passes
        with pytest.raises(EndpointError, match="wants an API key"):
            check_endpoint(base)
        monkeypatch.setenv("FF_DEAD_KEY", "not-" + KEY)
        code, err, _ = replay(capsys, base, tmp_path, "--api-key-env", "FF_DEAD_KEY")
        assert code != 0 and error_lines(err) == [
            f"filledfirst: error: {base} refused the API key (HTTP 401 from /v1/models)"]
        assert KEY not in err and double.requests == 0  # no completion was sent
        monkeypatch.setenv("FF_DEAD_KEY", KEY)
        code, err, _ = replay(capsys, base, tmp_path, "--api-key-env", "FF_DEAD_KEY")
    assert code == 0, err
    assert double.requests == 8
    assert json.loads((tmp_path / "out" / "run.json").read_text())["status"] == "ok"


def test_a_server_that_is_not_ready_is_named_with_its_answer():
    # Bound and listening, but the answer to everything is 503: ready it is not.
    class NotReady(StreamDouble):
        def _handle(self, conn, method, path, headers, body):
            return conn.respond(503, b"loading the model\nsecond line", "text/plain")

    with NotReady().serving_in_thread() as base:
        with pytest.raises(EndpointError) as err:
            check_endpoint(base)
    assert str(err.value) == f"{base} is not ready: HTTP 503 from /v1/models: loading the model"


def test_a_replay_whose_every_request_failed_is_failed_with_the_commonest_error(capsys, caplog, tmp_path):
    """The double answers: request 0 a 400, every other one a 404 (a wrong model name)."""

    def answer(req):
        if req.n == 0:
            return Answer(status=400, body=b'{"error": "max_tokens is too large"}')
        return Answer(status=404, body=b'{"error": "The model `double` does not exist."}')

    with StreamDouble(answer).serving_in_thread() as base:
        code, err, _ = replay(capsys, base, tmp_path)
    assert code == 1
    out = tmp_path / "out"
    meta = json.loads((out / "run.json").read_text())
    why = ('every request failed (8 http_error of 8 sent); commonest error (7 of 8): '
           '{"error": "The model `double` does not exist."}')
    assert (meta["status"], meta["error"]) == ("failed", why)
    assert meta["request_status_counts"] == {"http_error": 8}
    assert why in caplog.text  # the log names the reason too
    # The database, the diagnosis and the report: a failed run, with that error.
    db = tmp_path / "f.duckdb"
    ingest([out], db)
    diagnosis = write_diagnosis(db, DiagnosisRules()).to_dicts()
    assert [(d["label"], d["clue"]) for d in diagnosis] == [("failed", why)]
    con = duckdb.connect(str(db), read_only=True)
    summary = RunRow.of(signals.run_summary(con))
    con.close()
    assert [(r.status, r.error, r.n_failed) for r in summary] == [("failed", why, 8)]
    html = tables.runs_table(summary)
    assert "<td>failed</td>" in html and "does not exist" in html


def test_one_request_that_succeeded_keeps_the_run_ok():
    recs = [RequestRecord(i, "r", 1, 1, 0.0, status=s, error=None if s == "ok" else "boom")
            for i, s in enumerate(["disconnected", "ok", "timeout", "not_sent"])]
    assert every_request_failed(recs) is None
    assert every_request_failed([RequestRecord(0, "r", 1, 1, 0.0, status="not_sent")]) is None  # none sent
    recs[1].status = "timeout"
    recs[1].error = recs[2].error = "no first token within 1 s"
    assert every_request_failed(recs) == ("every request failed (2 timeout, 1 disconnected of 3 sent); "
                                          "commonest error (2 of 3): no first token within 1 s")


@pytest.fixture
def external(tmp_path):
    """An experiment of the pipeline against `server.url` (set by the test)."""
    cfg = copy.deepcopy(load_config([REPO / "tests" / "configs" / "e2e.yaml"]))
    cfg["model"]["name"] = "double"
    cfg["experiments"] = {"deployed": {"workload": "light", "server": {"url": "http://127.0.0.1:1"}}}
    job = Job("deployed", probe_schedule(tmp_path / "s.parquet", n=8), tmp_path / "runs" / "deployed")
    return cfg, job


def run_external(cfg, job, url, monkeypatch) -> dict:
    from filledfirst.run import runner

    monkeypatch.setattr(runner, "install_interrupt_handlers", lambda: None)
    monkeypatch.setattr(runner, "watch_owners", lambda: None)
    cfg["experiments"]["deployed"]["server"]["url"] = url
    validate_config(cfg)
    statuses = run_experiments(as_study(cfg), [job], progress=False)
    meta = json.loads((job.out / "run.json").read_text())
    assert statuses == [meta["status"]]
    return meta


def test_a_dead_endpoint_of_the_pipeline_is_a_failed_run_kept_as_a_result(external, monkeypatch):
    cfg, job = external
    url = f"http://127.0.0.1:{closed_port()}"
    t0 = time.monotonic()
    meta = run_external(cfg, job, url, monkeypatch)  # no exception: the pipeline goes on
    assert time.monotonic() - t0 < 5
    assert meta["status"] == "failed" and meta["error"].startswith(f"cannot reach {url}: connection refused")
    assert not (job.out / "requests.parquet").exists()  # nothing was measured


def test_a_pipeline_run_whose_every_request_failed_is_failed(external, monkeypatch):
    cfg, job = external
    with StreamDouble(Answer(fault="close")).serving_in_thread() as base:
        meta = run_external(cfg, job, base, monkeypatch)
    assert meta["status"] == "failed"
    assert meta["error"].startswith("every request failed (8 disconnected of 8 sent); commonest error (8 of 8): ")
    assert meta["request_status_counts"] == {"disconnected": 8}


def test_a_pipeline_run_against_a_live_double_is_ok(external, monkeypatch):
    cfg, job = external
    double = StreamDouble(ttft_s=0.01, itl_s=0.005)
    with double.serving_in_thread() as base:
        meta = run_external(cfg, job, base, monkeypatch)
    assert meta["status"] == "ok" and meta["error"] is None
    assert meta["request_status_counts"] == {"ok": 8} and len(double.emitted) == 8
