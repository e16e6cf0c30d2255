"""No secret reaches anything a run writes or shows, and vLLM still gets every one.

Secrets planted where users put them (an endpoint URL's user and password, an API key in
the environment, `engine.env`, `--api-key` in `extra_args`) and runs made through the real
code paths: `filledfirst replay` against the loopback double; `filledfirst run` with a
stand-in for vLLM that serves the double on the port the runner chose and logs its
arguments the way older vLLM versions did (key included); a server that never starts; a
capacity search whose probe failed that way. Then everything is grepped for them: every
file of the run folders, search.json, the database (its bytes and every table), the
report and what was printed or logged."""

from __future__ import annotations

import contextlib
import copy
import io
import logging

import duckdb
import pytest

from filledfirst import cli, interrupts, redact
from filledfirst.analysis.diagnosis import write_diagnosis
from filledfirst.config import load_config, search_fingerprint, validate_config
from filledfirst.engine import server as server_module
from filledfirst.engine import shared as shared_module
from filledfirst.engine.command import ServerCommand
from filledfirst.engine.server import VllmServer
from filledfirst.loadgen.endpoint import EndpointError, check_endpoint
from filledfirst.report import render
from filledfirst.run import runner
from filledfirst.run import search as frun
from filledfirst.run.runner import Job, run_experiments
from filledfirst.store.ingest import ingest
from filledfirst.study import DiagnosisRules, Study, as_study

from conftest import REPO
from helpers.fake_server import FakeVllm
from helpers.popen import record_popen
from helpers.report_runs import QMD
from helpers.schedules import probe_schedule
from helpers.stream_double import Answer, StreamDouble

URL_USER = "planteduser-7c1e"
URL_PASSWORD = "PLANTED-url-password-5b2e"
API_KEY = "sk-PLANTED-key-from-env-93ad"
KEY_ENV = "FF_TEST_PLANTED_KEY"
ENV = {"HF_TOKEN": "PLANTED1-hf-token-0d4c", "MY_SECRET_KEY": "PLANTED2-secret-key-71f0"}
FLAG_KEY = "PLANTED3-api-key-flag-a5e9"
EQ_KEY = "PLANTED4-api-key-eq-c3b8"
EXTRA_ARGS = ["--api-key", FLAG_KEY, "--other=1", f"--api-key={EQ_KEY}"]
SECRETS = (URL_USER, URL_PASSWORD, API_KEY, *ENV.values(), FLAG_KEY, EQ_KEY)


def leaks(text: str | bytes, where: str) -> list[str]:
    data = text.encode() if isinstance(text, str) else text
    return [f"{s} in {where}" for s in SECRETS if s.encode() in data]


def echo_first(request) -> Answer | None:
    """The first request is refused with what it was sent quoted back, as some servers do."""
    if request.n == 0:
        return Answer(status=400, body=f"bad request: Authorization: {request.headers['authorization']}".encode())
    return None


@contextlib.contextmanager
def captured():
    """Everything printed (stdout, stderr) and logged (every level) inside the block."""
    out, err, logged = io.StringIO(), io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(logged)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield lambda: out.getvalue() + err.getvalue() + logged.getvalue()
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def vllm_start_lines(cmd: ServerCommand) -> str:
    """What a vLLM log can hold at start: the command line, the environment, the parsed
    arguments (vLLM 0.32 masks api_key there; older versions printed it)."""
    return (f"launching: {' '.join(cmd.argv)}\n"
            + "".join(f"env {k}={v}\n" for k, v in cmd.env.items())
            + f"INFO 12-01 [api_utils.py:286] non-default args: {{'api_key': [{FLAG_KEY!r}, {EQ_KEY!r}], "
            f"'hf_token': {ENV['HF_TOKEN']!r}}}\n")


class DoubleAsVllm(FakeVllm):
    """The fake vLLM, logging at start what vLLM may log (the planted secrets among it),
    then the loopback double answers on the host and port the runner chose."""

    serve = True
    startup_s = 0.5

    def start_log(self) -> str:
        return vllm_start_lines(self.cmd)


def planted_config() -> dict:
    cfg = copy.deepcopy(load_config([REPO / "tests" / "configs" / "e2e.yaml"]))
    cfg["engine"]["env"] = dict(ENV)
    cfg["engine"]["server"]["extra_args"] = list(EXTRA_ARGS)
    cfg["workloads"]["light"]["phases"][0].update(count=6, interval_s=0.05, output_tokens=4)
    cfg["experiments"] = {"planted": {"workload": "light", "description": "a run with planted secrets"}}
    cfg["frontiers"] = {"cap": {"workload": "light", "settings": {"default": {}},
                                "slo": {"ttft_ms": 500, "itl_ms": 100}, "start": 1, "maximum": 4, "probe_s": 1}}
    validate_config(cfg)
    return cfg


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """The runs, the database and the report, and everything printed or logged meanwhile."""
    root = tmp_path_factory.mktemp("secrets")
    mp = pytest.MonkeyPatch()
    mp.setenv(KEY_ENV, API_KEY)
    mp.setattr(shared_module, "VllmServer", DoubleAsVllm)
    for module in (runner, frun):  # the test process's own signal handlers and parent stay
        mp.setattr(module, "install_interrupt_handlers", lambda: None)
        mp.setattr(module, "watch_owners", lambda: None)
    mp.setattr(interrupts, "_interrupt_reason", None)
    DoubleAsVllm.commands = []
    runs = root / "runs"
    try:
        with captured() as printed:
            # filledfirst replay, with the endpoint's user and password in the URL and the key
            double = StreamDouble(echo_first, ttft_s=0.01, itl_s=0.005, api_key=API_KEY)
            sched = probe_schedule(root / "s.parquet", n=6)
            with double.serving_in_thread() as base:
                url = base.replace("http://", f"http://{URL_USER}:{URL_PASSWORD}@")
                code = cli.main(["replay", "--url", url, "--schedule", str(sched),
                                 "--out", str(runs / "replayed"), "--model", "double", "--token-ids", "10", "20",
                                 "--scrape-interval", "0.1", "--api-key-env", KEY_ENV, "--name", "replayed",
                                 "--no-progress"])
                assert code == 0, printed()
                assert len(double.emitted) == 5  # the key was sent: every request but the refused one streamed
                # an endpoint that cannot be reached: the error names it
                dead = f"http://{URL_USER}:{URL_PASSWORD}@127.0.0.1:1"
                assert cli.main(["replay", "--url", dead, "--schedule", str(root / "s.parquet"),
                                 "--out", str(runs / "dead"), "--model", "double", "--token-ids", "10", "20",
                                 "--no-progress"]) == 2
            # filledfirst run: a server the study starts, with engine.env and --api-key
            cfg = planted_config()
            light = probe_schedule(root / "light.parquet", n=6)
            assert run_experiments(as_study(cfg), [Job("planted", light, runs / "started")], progress=False) == ["ok"]
            DoubleAsVllm.lives = 1  # alive when the runner records it, dead once the replay looks
            assert run_experiments(as_study(cfg), [Job("planted", light, runs / "died")], progress=False) == ["partial"]
            DoubleAsVllm.lives, DoubleAsVllm.fail = None, True
            assert run_experiments(as_study(cfg), [Job("planted", light, runs / "never-started")],
                                   progress=False) == ["failed"]
            # a capacity search whose first probe met a server that did not start
            search_dir = runs / "search"
            frun.run_frontier(Study.from_dict(cfg), "cap", "default", search_dir, progress=False,
                              fingerprint=search_fingerprint(as_study(cfg), "cap", "default"))
            db = root / "study.duckdb"
            ingest([runs / "replayed", runs / "started", runs / "died", runs / "never-started", search_dir], db)
            write_diagnosis(db, DiagnosisRules())
            report = root / "report.html"
            render.render_report(QMD, db, report, engine="fallback")
            text = printed()
    finally:
        DoubleAsVllm.fail, DoubleAsVllm.lives = False, None
        mp.undo()
    return {"root": root, "runs": runs, "db": db, "report": report, "printed": text,
            "commands": list(DoubleAsVllm.commands)}


def test_the_runs_went_through(outputs):
    """The greps below look at real outputs: runs that were measured, a report with them."""
    import json

    runs = outputs["runs"]
    statuses = {d.name: json.loads((d / "run.json").read_text())["status"]
                for d in [runs / "replayed", runs / "started", runs / "died", runs / "never-started",
                          runs / "search" / "p01"]}
    assert statuses == {"replayed": "ok", "started": "ok", "died": "partial", "never-started": "failed",
                        "p01": "failed"}
    died = json.loads((runs / "died" / "run.json").read_text())["error"]
    assert died.startswith("vLLM exited during the run.") and "non-default args" in died  # it quotes the log
    assert (runs / "search" / "search.json").is_file() and not (runs / "dead").exists()
    replayed = json.loads((runs / "replayed" / "run.json").read_text())
    assert replayed["request_status_counts"] == {"ok": 5, "http_error": 1}
    assert replayed["scrape_errors"] == 0  # /metrics was scraped, without the URL's credentials
    assert replayed["server"]["url"].startswith("http://127.0.0.1:")
    html = outputs["report"].read_text()
    # the runs are in it, the server command with its redacted values too
    assert "replayed" in html and "planted" in html and "--api-key &lt;redacted&gt;" in html


def test_no_planted_secret_in_any_file_of_a_run(outputs):
    found = []
    for path in sorted(outputs["runs"].rglob("*")):
        if path.is_file():
            found += leaks(path.read_bytes(), str(path.relative_to(outputs["runs"])))
    assert found == []


def test_no_planted_secret_in_the_database(outputs):
    db = outputs["db"]
    found = []
    for path in db.parent.glob(db.name + "*"):  # the file and anything beside it (a WAL)
        found += leaks(path.read_bytes(), path.name)
    con = duckdb.connect(str(db), read_only=True)
    try:
        tables = [t for (t,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()]
        assert {"runs", "requests", "frontier_searches"} <= set(tables)
        for table in tables:
            found += leaks(repr(con.execute(f'SELECT * FROM "{table}"').fetchall()), f"table {table}")
    finally:
        con.close()
    assert found == []


def test_no_planted_secret_in_the_report(outputs):
    assert leaks(outputs["report"].read_bytes(), "the report") == []


def test_no_planted_secret_printed_or_logged(outputs):
    printed = outputs["printed"]
    assert "cannot reach http://127.0.0.1:1" in printed  # the dead endpoint's error, without its user
    assert "the user and password in the URL are not sent" in printed
    assert leaks(printed, "stdout, stderr or the log") == []


def test_vllm_got_every_secret_unchanged(outputs):
    commands = outputs["commands"]
    assert commands
    for cmd in commands:
        assert cmd.argv[-len(EXTRA_ARGS):] == EXTRA_ARGS
        assert {k: cmd.env[k] for k in ENV} == ENV


def test_starting_vllm_logs_its_command_without_secrets(tmp_path, monkeypatch, caplog):
    """VllmServer.start itself: the log line is redacted, exec gets the real argv and env."""
    calls = record_popen(monkeypatch, server_module)
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m", *EXTRA_ARGS]
    cmd = ServerCommand(argv=list(argv), env=dict(ENV))
    with caplog.at_level(logging.INFO, logger=server_module.__name__):
        VllmServer(cmd, host="127.0.0.1", port=1, log_path=tmp_path / "vllm.log", startup_timeout_s=1).start()
    (args, kw), *_ = calls
    assert args == argv and {k: kw["env"][k] for k in ENV} == ENV
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("starting vLLM"))
    assert leaks(line, "the start line") == [] and "--other=1" in line and redact.MARK in line


def test_the_endpoint_check_says_where_without_credentials():
    with pytest.raises(EndpointError) as err:
        check_endpoint(f"https://{URL_USER}:{URL_PASSWORD}@127.0.0.1:1")
    assert str(err.value).startswith("cannot reach https://127.0.0.1:1: ") and leaks(str(err.value), "it") == []


def test_the_spec_fingerprint_is_the_config_as_written(outputs):
    """run.json's spec is redacted; its fingerprint (what decides re-runs and restores) is
    still the one of the config as written."""
    import json

    from filledfirst.config import spec_document, spec_fingerprint

    meta = json.loads((outputs["runs"] / "started" / "run.json").read_text())
    written = spec_document(as_study(planted_config()), "planted")
    assert meta["spec"]["engine"]["env"] == {k: redact.MARK for k in ENV}
    assert meta["spec_fingerprint"] == spec_fingerprint(written) != spec_fingerprint(meta["spec"])


@pytest.mark.parametrize("name, secret", [
    ("HF_TOKEN", True), ("MY_SECRET_KEY", True), ("--api-key", True), ("api_key", True), ("Authorization", True),
    ("AWS_SECRET_ACCESS_KEY", True), ("DB_PASSWORD_FILE", True), ("apiKey", True), ("X-Api-Key", True),
    ("hf_token", True), ("token", True),
    ("prompt_token_ids", False), ("max_num_batched_tokens", False), ("prompt_tokens", False),
    ("api_key_env", False), ("keep_every", False), ("kv_cache_space_gib", False), ("--max-num-seqs", False),
    ("HF_HUB_OFFLINE", False), ("monkey", False),
])
def test_secrets_are_told_by_name(name, secret):
    assert redact.is_secret_name(name) is secret


def test_what_redaction_keeps_and_replaces():
    m = redact.MARK
    assert redact.redact_url("https://u:p@w@host:8000/v1?x=1") == "https://host:8000/v1?x=1"
    assert redact.redact_url("http://host:8000") == "http://host:8000"
    assert redact.redact_argv(["--model", "m", "--hf-token", "t", "--api-key=k", "--url=http://u:p@h/"]) == [
        "--model", "m", "--hf-token", m, f"--api-key={m}", "--url=http://h/"]
    assert redact.redact_env({"HF_TOKEN": "t", "HF_HOME": "/h", "EMPTY_TOKEN": ""}) == {
        "HF_TOKEN": m, "HF_HOME": "/h", "EMPTY_TOKEN": ""}
    assert redact.redact_text("Authorization: Bearer abc, api_key='x1', HF_TOKEN=y2 --api-key z3 max_tokens=5") == (
        f"Authorization: {m}, api_key='{m}', HF_TOKEN={m} --api-key {m} max_tokens=5")
    assert redact.redact_text("printed as [s3cr3t-value] here", ["s3cr3t-value"]) == f"printed as [{m}] here"
    # a secret value held by name is found again in the document's text, however quoted
    doc = {"hardware": {"gpu": "x", "vendor_token": "abc-123"}, "n_token": 3, "token_ids": None,
           "error": "failed: 'abc-123' refused; --password hunter22"}
    assert redact.redact_document(doc) == {"hardware": {"gpu": "x", "vendor_token": m}, "n_token": 3,
                                           "token_ids": None, "error": f"failed: '{m}' refused; --password {m}"}


def test_a_secret_flag_without_a_value_hides_nothing_else():
    assert redact.redact_argv(["--hf-token", "--max-num-seqs", "8", "--api-key", "k", "--api-key="]) == [
        "--hf-token", "--max-num-seqs", "8", "--api-key", redact.MARK, f"--api-key={redact.MARK}"]


def test_the_endpoint_check_does_not_repeat_the_key_a_server_quotes():
    class Quoting(StreamDouble):
        def _handle(self, conn, method, path, headers, body):
            return conn.respond(503, f"not ready for key {headers.get('authorization')}".encode(), "text/plain")

    with Quoting().serving_in_thread() as base:
        with pytest.raises(EndpointError) as err:
            check_endpoint(base, API_KEY)
    assert str(err.value) == f"{base} is not ready: HTTP 503 from /v1/models: not ready for key Bearer {redact.MARK}"
