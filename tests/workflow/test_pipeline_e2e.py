"""The whole pipeline on the real vLLM CPU engine: Snakemake -> run folders -> DuckDB -> report."""

import json
import shutil
import subprocess

import duckdb
import pyarrow.parquet as pq
import pytest

from filledfirst.analysis import request_path, signals

from conftest import REPO, snakemake_argv

pytestmark = pytest.mark.engine


def run_pipeline(workdir, cfg, env):
    proc = subprocess.run(snakemake_argv(workdir, cfg, "all"), env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return workdir


def test_end_to_end_on_the_real_engine(tmp_path, pipeline_env):
    # As a user runs a study of their own: a copy of the config outside the repository,
    # Snakemake's --directory elsewhere. Nothing may be found through the checkout (the
    # sections file the config names ships with the package; the model is the workdir's).
    cfg = tmp_path / "my-study" / "e2e.yaml"
    cfg.parent.mkdir()
    shutil.copy(REPO / "tests" / "configs" / "e2e.yaml", cfg)
    assert REPO not in cfg.resolve().parents
    (tmp_path / "work").mkdir()
    workdir = run_pipeline(tmp_path / "work", cfg, pipeline_env)
    check_study(workdir)
    check_shared_server(workdir)
    check_report_in_browser(workdir, tmp_path)

    # Nothing to do on a second run: every output is complete and up to date.
    again = subprocess.run(
        snakemake_argv(workdir, cfg, "all", "-n"),
        env=pipeline_env, capture_output=True, text=True, timeout=300,
    )
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


def diag_clue(con, experiment: str) -> str:
    return con.execute("SELECT clue FROM diagnosis WHERE experiment = ?", [experiment]).fetchall()[0][0]


def check_study(workdir):
    db = workdir / "results" / "filledfirst.duckdb"
    con = duckdb.connect(str(db), read_only=True)

    runs = dict(con.execute("SELECT experiment, status FROM runs").fetchall())
    assert runs == {"reference": "ok", "seq_limit": "ok", "azure_replay": "ok", "budget_default": "ok",
                    "budget_small": "ok"}

    # Every scheduled request is there, answered with exactly the sizes asked for.
    for exp in runs:
        sched = workdir / "results" / "runs" / exp / "schedule.parquet"
        n_sched = con.execute("SELECT count(*) FROM read_parquet(?)", [str(sched)]).fetchall()[0][0]
        n, n_ok, exact = con.execute(
            """SELECT count(*), count(*) FILTER (r.status = 'ok'),
                      count(*) FILTER (prompt_tokens_received = prompt_tokens
                                       AND output_tokens_received = output_tokens)
               FROM requests r JOIN runs USING (run_id) WHERE experiment = ?""",
            [exp],
        ).fetchall()[0]
        assert n == n_sched > 0
        assert n_ok == n, f"{exp}: {n - n_ok} failed requests"
        assert exact == n
        # the chunks' token counts add up to what usage reported, for every request
        mismatched = con.execute(
            """SELECT count(*) FROM requests r JOIN runs USING (run_id)
               LEFT JOIN (SELECT run_id, request_id, sum(n) AS n FROM tokens GROUP BY ALL) t
               USING (run_id, request_id)
               WHERE experiment = ? AND coalesce(t.n, 0) <> r.output_tokens_received""",
            [exp],
        ).fetchall()[0][0]
        assert mismatched == 0
        # every chunk on the run's clock, after its request was sent
        bad = con.execute(
            """SELECT count(*) FROM tokens t JOIN requests r USING (run_id, request_id)
               JOIN runs USING (run_id) WHERE experiment = ? AND t.t < r.t_sent""",
            [exp],
        ).fetchall()[0][0]
        assert bad == 0

    summary = {r["experiment"]: r for r in signals.run_summary(con).to_dicts()}
    ref, lim = summary["reference"], summary["seq_limit"]
    # None of this depends on the CPU's speed: 16 closed-loop workers against a cap of 8
    # keep 8 running and the rest waiting until the last 8 requests; the reference's 24
    # requests in all can never fill a cap of 64, so nothing ever waits. The scheduler
    # never ran more than the cap.
    assert lim["max_num_seqs"] == 8 and lim["running_max"] == 8
    assert lim["waiting_max"] > 0
    # (Not that a scrape saw one running: a fast server can finish each of these between
    # two scrapes, whose grid is as regular as the arrivals'.)
    assert ref["waiting_max"] == 0 and ref["running_max"] <= 24
    # Under the cap all but the first 8 requests wait for a whole 128-token decode to
    # end before their prefill starts; the reference's wait for nothing.
    assert lim["ttft_p50_ms"] > ref["ttft_p50_ms"]
    assert all(r["n_usage_mismatch"] == 0 for r in summary.values())
    # Our TTFT against vLLM's own histogram for the same run. Each request's TTFT from its
    # send contains the server's (which starts when vLLM receives it), so our median can
    # never fall below the bucket holding vLLM's median. Where TTFT is mostly queueing
    # (seq_limit), the HTTP front end's few ms are a small share at any CPU speed, and the
    # two must agree; at small TTFTs that share is the machine's, so it is only reported.
    checks = {c["run_id"]: c for c in signals.ttft_against_server(con).to_dicts()}
    ids = dict(con.execute("SELECT experiment, run_id FROM runs").fetchall())
    for c in checks.values():
        assert c["n_server"] == c["n_client"] > 0
        assert c["client_ttft_p50_ms"] >= (c["bucket_lo_ms"] or 0), c
    assert checks[ids["seq_limit"]]["agrees"], checks[ids["seq_limit"]]
    # The request path: the pipeline starts vLLM with its per-request timings, so every ok
    # request has vLLM's queue and prefill; each part is non-negative (vLLM's interval lies
    # inside ours: the front end is what remains of our TTFT from send, a ms of float slack).
    parts = {r["experiment"]: r for r in con.sql(f"""
        SELECT experiment, count(*) AS n_ok, count(*) FILTER (WHERE timed) AS n_timed,
               min(dispatch_ms) AS dispatch_min, min(queue_ms) AS queue_min, min(prefill_ms) AS prefill_min,
               min(front_end_ms) AS front_end_min,
               max(abs(dispatch_ms + front_end_ms + queue_ms + prefill_ms - ttft_ms)) AS sum_error,
               sum(queue_ms) / sum(ttft_ms) AS queue_share
        FROM ({request_path.REQUEST_PARTS}) p JOIN runs USING (run_id) WHERE p.status = 'ok' GROUP BY experiment
        """).pl().to_dicts()}
    for exp, p in parts.items():
        assert p["n_timed"] == p["n_ok"] > 0, p
        assert min(p["dispatch_min"], p["queue_min"], p["prefill_min"]) >= 0 and p["front_end_min"] >= -1, p
        assert p["sum_error"] < 1e-6, p
    # Under a cap of 8 with 16 workers, all but the first 8 requests wait out a whole
    # decode in vLLM's queue: the queue is most of their TTFT. Nothing ever waits in the
    # reference.
    assert parts["seq_limit"]["queue_share"] > 0.5 > parts["reference"]["queue_share"], parts
    assert "vLLM's queue was" in diag_clue(con, "seq_limit")
    # vLLM's own gauges were scraped on the run's clock
    for exp in runs:
        metrics = {m for (m,) in con.execute(
            "SELECT DISTINCT metric FROM samples JOIN runs USING (run_id) WHERE experiment = ?", [exp]).fetchall()}
        assert {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"} <= metrics

    # The diagnosis (written by the pipeline's ingest step) names what each run was built for.
    diag = {d["experiment"]: d for d in con.sql("SELECT * FROM diagnosis").pl().to_dicts()}
    assert set(diag) == set(runs)
    for exp in ("reference", "seq_limit", "budget_default", "budget_small"):
        assert diag[exp]["label"] == diag[exp]["expect"], diag[exp]
    assert "of 8" in diag["seq_limit"]["clue"] and "%" in diag["seq_limit"]["clue"]
    # the budget each engine ran with: as vLLM logged it, and as configured
    assert [diag[e]["token_budget"] for e in ("budget_small", "budget_default")] == [64, 2048]
    assert diag["budget_small"]["budget_fill"] >= 0.8 and diag["budget_small"]["budget_queued_steps"] > 0
    small = json.loads((workdir / "results" / "runs" / "budget_small" / "run.json").read_text())
    assert small["server"]["max_num_batched_tokens"] == 64

    meta = json.loads((workdir / "results" / "runs" / "seq_limit" / "run.json").read_text())
    assert "--max-num-seqs" in meta["server"]["argv"] and meta["versions"]["vllm"]
    assert "--enable-per-request-metrics" in meta["server"]["argv"]
    assert (workdir / "results" / "runs" / "seq_limit" / "server.log").stat().st_size > 0

    html = (workdir / "reports" / "report.html").read_text()
    for exp in runs:
        assert exp in html
    assert "max_num_seqs 8" in html
    assert "What filled up first" in html and "active-sequence limit" in html


def check_shared_server(workdir):
    """reference, azure_replay and budget_default have the same server settings: one job,
    one start-up, complete run folders, each with its own part of the server log."""
    runs, logs = workdir / "results" / "runs", workdir / "results" / "logs"
    group = ["reference", "azure_replay", "budget_default"]
    first, second = (json.loads((runs / e / "run.json").read_text()) for e in group[:2])
    assert [first["server"]["group_position"], second["server"]["group_position"]] == [1, 2]
    for meta in (first, second):
        assert meta["server"]["shared_with"] == group and meta["server"]["started_by"] == "reference"
    assert first["server"]["url"] == second["server"]["url"]
    assert first["timings"]["startup_s"] > 0 and "startup_s" not in second["timings"]
    assert second["timings"]["startup_reused_s"] == first["timings"]["startup_s"]
    assert "idle_wait_s" in second["timings"]
    assert (logs / "run-reference.log").read_text().count("starting vLLM") == 1
    assert (logs / "run-seq_limit.log").is_file() and not (logs / "run-azure_replay.log").exists()

    # server.log split: the start-up only in the first part, every request in its run's part
    parts = {e: (runs / e / "server.log").read_text() for e in group[:2]}
    assert "Starting vLLM" in parts["reference"] and "Starting vLLM" not in parts["azure_replay"]
    for e in group[:2]:
        n = pq.read_metadata(runs / e / "requests.parquet").num_rows
        assert parts[e].count("POST /v1/completions") == n, e

    # The second run starts on the same server (its counters go on from the first run's),
    # idle: nothing waiting, and nothing running but what it had sent itself.
    con = duckdb.connect()
    t0, duration = con.execute(
        "SELECT t, value FROM read_parquet(?) WHERE metric = 'filledfirst:scrape_duration_seconds' ORDER BY t LIMIT 1",
        [str(runs / "azure_replay" / "samples.parquet")]).fetchone()
    first_scrape = dict(con.execute(
        "SELECT metric, sum(value) FROM read_parquet(?) WHERE t = ? GROUP BY metric",
        [str(runs / "azure_replay" / "samples.parquet"), t0]).fetchall())
    sent = con.execute("SELECT count(*) FROM read_parquet(?) WHERE t_sent <= ?",
                       [str(runs / "azure_replay" / "requests.parquet"), t0 + duration]).fetchone()[0]
    assert first_scrape["vllm:num_requests_waiting"] == 0
    assert first_scrape["vllm:num_requests_running"] <= sent
    prompt_tokens_before = con.execute("SELECT sum(prompt_tokens_received) FROM read_parquet(?)",
                                       [str(runs / "reference" / "requests.parquet")]).fetchone()[0]
    assert first_scrape["vllm:prompt_tokens_total"] >= prompt_tokens_before > 0


def check_report_in_browser(workdir, tmp_path):
    """The pipeline's own report, offline in headless Chromium: every chart drew, the page
    logged nothing to its console, and it stays small."""
    from helpers.chromium import CHROMIUM, ChartDivs, chromium_run

    html = workdir / "reports" / "report.html"
    assert html.stat().st_size < 5_000_000
    if not CHROMIUM.exists():
        return  # the `chromium` fixture fails the browser tests in CI when chromium is missing
    run = chromium_run("--dump-dom", html.as_uri(), profile=tmp_path / "chromium")
    charts = ChartDivs()
    charts.feed(run.stdout)
    # a chart per run, the goodput chart, a TTFT-parts chart per run (vLLM timed them all),
    # and the step time's where a setting had enough intervals to fit
    with duckdb.connect(str(workdir / "results" / "filledfirst.duckdb"), read_only=True) as con:
        fitted = con.execute("SELECT count(*) FROM step_models").fetchall()[0][0] > 0
    assert len(charts.charts) == 5 + 1 + 5 + fitted and all(charts.charts.values()), charts.charts
    assert [line for line in run.stderr.splitlines() if ":CONSOLE" in line] == []
