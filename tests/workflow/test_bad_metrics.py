"""A server whose /metrics is sometimes damaged (a byte that is not UTF-8) and carries NaN
and infinite gauges: the run ends ok with the bad scrapes counted, the non-finite values
are stored, counted and read as unknown, and the report draws every chart.

The double is the thing that misbehaves; what is tested is our scraper, ingest,
diagnosis and report, end to end through the command line."""

from __future__ import annotations

import json

import duckdb
import pytest

from filledfirst import cli
from filledfirst.analysis import signals

from helpers.chromium import ChartDivs, chromium_run
from helpers.report_runs import QMD
from helpers.schedules import probe_schedule
from helpers.stream_double import StreamDouble

GAUGES = (
    "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{engine=\"0\"}} {running}\n"
    "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{engine=\"0\"}} 0\n"
    "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 {help} percent usage.\n"
    "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{engine=\"0\"}} {kv}\n"
)


class Pages:
    """Page k: every third damaged (Latin-1 in a HELP line), and of the others every
    second with a NaN KV gauge and every fifth with running at +Inf."""

    def __init__(self) -> None:
        self.bad = 0
        self.nonfinite = 0

    def __call__(self, k: int) -> bytes:
        if k % 3 == 1:
            self.bad += 1
            return GAUGES.format(running=1, kv=0.25, help="\xe9").encode("latin-1")
        kv, running = ("NaN" if k % 2 == 0 else "0.25"), ("+Inf" if k % 5 == 0 else "1")
        self.nonfinite += (kv == "NaN") + (running == "+Inf")
        return GAUGES.format(running=running, kv=kv, help="").encode()


@pytest.mark.browser
def test_damaged_and_nan_metrics_leave_the_run_ok_counted_and_the_report_drawn(chromium, tmp_path):
    pages = Pages()
    double = StreamDouble(ttft_s=0.01, itl_s=0.01, metrics_text=pages)
    out = tmp_path / "run"
    sched = probe_schedule(tmp_path / "s.parquet", n=24, output=6)
    with double.serving_in_thread() as base:
        code = cli.main(["replay", "--url", base, "--schedule", str(sched),
                         "--out", str(out), "--model", "double", "--token-ids", "10", "20", "--no-progress",
                         "--scrape-interval", "0.05", "--name", "badmetrics"])
    assert code == 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "ok" and meta["request_status_counts"] == {"ok": 24}
    assert pages.bad >= 3 and pages.nonfinite >= 3  # enough of each to count
    assert meta["scrape_errors"] == pages.bad  # every damaged page, and only those

    db, report = tmp_path / "f.duckdb", tmp_path / "report.html"
    assert cli.main(["ingest", str(out), "--db", str(db)]) == 0
    assert cli.main(["diagnose", "--db", str(db)]) == 0
    assert cli.main(["report", "--db", str(db), "--out", str(report), "--source", str(QMD),
                     "--engine", "fallback"]) == 0
    with duckdb.connect(str(db), read_only=True) as con:
        summary = signals.run_summary(con).to_dicts()[0]
    assert summary["scrape_errors"] == pages.bad and summary["nonfinite_samples"] == pages.nonfinite
    assert summary["running_max"] == 1 and summary["kv_max_pct"] == pytest.approx(25.0)

    run = chromium_run("--dump-dom", report.as_uri(), profile=tmp_path / "profile")
    charts = ChartDivs()
    charts.feed(run.stdout)
    assert charts.charts and all(charts.charts.values()), f"charts without an <svg>: {charts.charts}"
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
