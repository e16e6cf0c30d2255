"""Signals computed by hand on small run folders, the report rendered by the fallback, and
the charts drawn by a real headless browser with no network."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import duckdb
import msgspec
import pyarrow as pa
import pytest
import yaml

from filledfirst.analysis import signals
from filledfirst.analysis.diagnosis import write_diagnosis
from filledfirst.config import load_study
from filledfirst.contracts.records import SAMPLE_SCHEMA
from filledfirst.contracts.stats import ScheduleStats
from filledfirst.report import markup, render, tables
from filledfirst.report.rows import RunRow
from filledfirst.study import DiagnosisRules

from conftest import REPO
from helpers.chromium import ChartDivs, chromium_run, screenshot
from helpers.report_runs import FAILED_RUN_ERROR, HOST, QMD, RUN_A, RUN_FAILED, RUN_LEGACY, report_db, report_runs


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    return report_db(root / "study.duckdb", report_runs(root))


@pytest.fixture(scope="module")
def con(db):
    c = duckdb.connect(str(db), read_only=True)
    yield c
    c.close()


@pytest.fixture(scope="module")
def report(db, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "report.html"
    render.render_report(QMD, db, out, engine="fallback")
    return out


# --- signals -------------------------------------------------------------------------------


def _by_run(df) -> dict[str, dict]:
    return {r["run_id"]: r for r in df.to_dicts()}


def test_run_summary_by_hand(con):
    summary = signals.run_summary(con)
    assert summary["run_id"].to_list() == [RUN_A, RUN_LEGACY, RUN_FAILED]  # by start time
    rows = _by_run(summary)
    a = rows[RUN_A]
    assert (a["n_requests"], a["n_ok"], a["n_failed"]) == (7, 6, 1)
    # ok TTFTs sorted: 40 50 60 110 200 800 (linear interpolation, like numpy)
    assert a["ttft_p50_ms"] == pytest.approx(85.0)  # (60 + 110) / 2
    assert a["ttft_p90_ms"] == pytest.approx(500.0)  # 200 + 0.5 * 600
    assert a["ttft_p99_ms"] == pytest.approx(770.0)  # 200 + 0.95 * 600
    # ok gaps sorted: 5 6 8 10 10 12 30 100
    assert a["itl_p50_ms"] == pytest.approx(10.0)
    assert a["itl_p99_ms"] == pytest.approx(95.1)  # 30 + 0.93 * 70
    # running summed over engines: 0 3 4 5 3 0; waiting: 0 0 1 3 0 0; KV max: 0 10 25 30 15 0
    assert (a["running_median"], a["running_max"]) == (3, 5)
    assert (a["waiting_median"], a["waiting_max"]) == (0, 3)
    assert a["kv_median_pct"] == pytest.approx(12.5)
    assert a["kv_max_pct"] == pytest.approx(30.0)
    assert a["preemptions"] == 4  # (5 - 2) + (1 - 0); _created ignored
    assert (a["max_num_seqs"], a["status"]) == (8, "ok")
    # every request was sent 1 ms after its scheduled time, the failed one included
    assert a["lag_p50_ms"] == pytest.approx(1.0) and a["lag_p99_ms"] == pytest.approx(1.0)

    legacy = rows[RUN_LEGACY]
    assert legacy["kv_max_pct"] == pytest.approx(4.0)
    assert legacy["kv_median_pct"] == pytest.approx(2.0)
    assert legacy["preemptions"] == 0
    assert legacy["itl_p50_ms"] == pytest.approx(75.0)  # gaps 100 and 50

    failed = rows[RUN_FAILED]
    assert (failed["status"], failed["error"]) == ("failed", FAILED_RUN_ERROR)
    assert (failed["n_requests"], failed["n_failed"]) == (0, 0)
    assert failed["ttft_p50_ms"] is None and failed["running_max"] is None


def test_role_summary_by_hand(con):
    rows = {(r["run_id"], r["role"]): r for r in signals.role_summary(con).to_dicts()}
    dec, probe = rows[(RUN_A, "decoding")], rows[(RUN_A, "probe")]
    assert (dec["n"], dec["n_failed"], probe["n"], probe["n_failed"]) == (3, 0, 4, 1)
    assert (dec["ttft_p50_ms"], dec["ttft_p90_ms"]) == (pytest.approx(50.0), pytest.approx(58.0))
    assert (probe["ttft_p50_ms"], probe["ttft_p90_ms"]) == (pytest.approx(200.0), pytest.approx(680.0))
    assert dec["itl_p50_ms"] == pytest.approx(12.0)  # 10 10 12 30 100
    assert dec["itl_p99_ms"] == pytest.approx(97.2)  # 30 + 0.96 * 70
    assert probe["itl_p50_ms"] == pytest.approx(6.0)  # 5 6 8
    roles_a = [r["role"] for r in signals.role_summary(con).to_dicts() if r["run_id"] == RUN_A]
    assert roles_a == ["decoding", "probe"]  # in arrival order


def test_timeseries_and_points(con):
    ts = signals.timeseries(con, RUN_A)
    running = ts.filter(ts["signal"] == "running")["value"].to_list()
    assert running == [0, 3, 4, 5, 3, 0]
    assert set(ts["signal"]) == {"running", "waiting", "kv_pct"}
    pts = signals.request_points(con, RUN_A)
    assert pts.height == 7
    failed = pts.filter(pts["status"] != "ok").to_dicts()
    assert [(f["request_id"], f["t_scheduled"], f["ttft_ms"]) for f in failed] == [(6, 1.75, None)]


# --- rendering -----------------------------------------------------------------------------


def test_parse_qmd_cells_and_options():
    text = "---\ntitle: T\nexecute:\n  echo: false\n---\n\n# Hi\n\n```{python}\n#| include: false\nx = 1\n```\n\ntext\n"
    front, cells = render.parse_qmd(text)
    assert front == {"title": "T", "execute": {"echo": False}}
    assert [c.kind for c in cells] == ["markdown", "code", "markdown"]
    assert cells[1].options == {"include": False} and cells[1].source == "x = 1"
    assert cells[1].line == 9


def test_the_fallbacks_table_of_contents_links_the_headings_down_to_its_depth():
    anchor = '<a class="anchor-link" href="#{0}">¶</a>'
    page = ("<body><main><h1 id='T'>T</h1>" + "".join(
        f'<h{n} id="{a}">{t}{anchor.format(a)}</h{n}>' for n, a, t in [(2, "A", "A &amp; B"), (3, "C", "C"),
                                                                        (4, "D", "D")])
        + "<h2>no id: made in a cell's HTML</h2></main></body>")
    with_toc = render.with_toc(page, 3)
    toc = with_toc[with_toc.index("<nav"):with_toc.index("</nav>")]
    assert with_toc.index("</h1>") < with_toc.index("<nav")  # after the title
    assert re.findall(r'margin-left: (\d)em"><a href="#(\w)">([^<]*)</a>', toc) == [
        ("0", "A", "A &amp; B"), ("1", "C", "C")]  # escaped once, as nbconvert made it
    assert render.with_toc(page.replace("<h1 id='T'>T</h1>", ""), 2).startswith("<body><main><nav")
    assert render.with_toc("<body><main><p>x</p></main></body>", 2) == "<body><main><p>x</p></main></body>"


def test_cell_error_fails_render(db, tmp_path):
    src = tmp_path / "bad.qmd"
    src.write_text("---\ntitle: bad\n---\n\n```{python}\nx = 1\n```\n\n```{python}\n1 / 0\n```\n")
    out = tmp_path / "bad.html"
    with pytest.raises(render.RenderError, match=r"cell 2 \(qmd line 9\).*ZeroDivisionError"):
        render.render_report(src, db, out, engine="fallback")
    assert not out.exists() and not list(tmp_path.glob(".bad.html*"))
    # the kernel that ran the cells is gone with the render, failed or not
    assert not kernels_of_this_process()


def kernels_of_this_process() -> list[str]:
    import psutil

    return [" ".join(p.cmdline()) for p in psutil.Process().children(recursive=True)
            if "ipykernel_launcher" in " ".join(p.cmdline())]


FAKE_QUARTO = """#!{python}
import os, sys, pathlib
args = sys.argv[1:]
assert args[0] == "render" and args[2:4] == ["--to", "html"], args
out = pathlib.Path(args[args.index("--output-dir") + 1]) / (pathlib.Path(args[1]).stem + ".html")
out.write_text("<html><p>db=" + os.environ["FILLEDFIRST_DB"] + " py=" + os.environ["QUARTO_PYTHON"] + "</p></html>")
"""


def test_auto_uses_quarto_when_on_path(db, tmp_path, monkeypatch):
    """Quarto is not installable here: a stand-in checks the arguments and environment."""
    import sys

    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "quarto"
    fake.write_text(FAKE_QUARTO.format(python=sys.executable))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "out" / "report.html"
    render.render_report(QMD, db, out)
    assert out.read_text() == f"<html><p>db={db.resolve()} py={sys.executable}</p></html>"


def test_the_configs_title_replaces_the_documents_own(db, tmp_path, monkeypatch):
    """report.title (`filledfirst report --title`): in the fallback's page and heading, and
    handed to Quarto as metadata that stays one YAML string whatever the title holds."""
    import sys

    src = tmp_path / "t.qmd"
    src.write_text("---\ntitle: The document's own\n---\n\nsome text\n")
    title = 'What filled: first? (CPU "study")'
    out = tmp_path / "fallback.html"
    render.render_report(src, db, out, engine="fallback", title=title)
    html = out.read_text()
    assert "The document's own" not in html
    assert html.count(f"<title>{title}</title>") == 1 and f">{title}<" in html.split("<body", 1)[1]

    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "quarto"
    fake.write_text(f"#!{sys.executable}\n" + """import json, pathlib, sys
args = sys.argv[1:]
out = pathlib.Path(args[args.index("--output-dir") + 1]) / (pathlib.Path(args[1]).stem + ".html")
out.write_text(json.dumps(args[args.index("--metadata") + 1]))
""")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    render.render_report(src, db, tmp_path / "quarto.html", title=title)
    metadata = json.loads((tmp_path / "quarto.html").read_text())
    key, _, value = metadata.partition(":")
    assert key == "title" and yaml.safe_load(value) == title


def test_remote_references():
    assert render.remote_references('<script src="https://cdn/x.js"></script><a href="https://x">') == [
        "https://cdn/x.js"
    ]
    assert render.remote_references('<link rel="stylesheet" href="//cdn/x.css">') == ["//cdn/x.css"]


def test_report_html(report):
    html = report.read_text()
    assert "<title>What filled up first?</title>" in html
    for run_id in (RUN_A, RUN_LEGACY, RUN_FAILED):
        assert run_id in html
    # per-run table, role table, side by side, setup
    assert "TTFT p90" in html and "500 ms" in html and "85.0 ms" in html
    assert "decoding" in html and "probe" in html and "680 ms" in html
    assert "3 / 5 (max_num_seqs 8)" in html
    assert "vllm.entrypoints.openai.api_server" in html and "0.32.0" in html
    # the per-run setup dumps are folded away; the summary comes first; no frontier, no section
    assert "<details><summary>schedule, per run (" in html and "<details><summary>timings, per run (" in html
    assert html.index("At a glance") < html.index("Every run replays")
    assert "Capacity search" not in html
    # the table of contents (the front matter's `toc`): each section, after the title
    toc = html[html.index('<nav id="TOC"'):html.index("</nav>")]
    assert html.index("</h1>") < html.index('<nav id="TOC"') < html.index('<h2 id="At-a-glance">')
    assert re.findall(r'<a href="#([^"]+)">', toc) == [
        "At-a-glance", "Runs", "What-filled-up-first", "The-study,-part-by-part", "Setup", "Side-by-side",
        "Measurement-checks", "Each-run"]
    # the original study's tables, section by section, with its own figures marked as such
    assert "How does a long prefill affect other requests?" in html and "short new requests" in html
    assert "What happens when decode load rises?" in html and "original, 80 ms" in html and "4,737 ms" in html
    assert "Reference: the original study's figures: Qwen2.5-7B-Instruct, bf16, one A100-40GB" in html
    # dated, with what it ran on, and where
    assert "Measured 2025-01-01 01:00 to 03:00 UTC (3 runs, 0 capacity-search probes)." in html
    assert "This page was made " in html and HOST in html
    # the diagnosis: a label per run and the evidence table
    assert "what filled first" in html and "first crossings" in html and "KV ledger" in html
    # the failed run's error, escaped; no data string became markup
    assert markup.esc(FAILED_RUN_ERROR) in html
    assert "<script>alert(1)" not in html and "<b>connection reset" not in html
    assert html.count('class="ff-chart"') == 4  # two runs (the failed one has none) + goodput + RUN_A's TTFT parts
    # the request path: RUN_A's server timings, the legacy run's none
    assert "per-request timings of 6 of 6 successful requests." in html
    assert f"TTFT parts (server queue, server prefill): {tables.NOT_REPORTED}." in html
    assert "queue + prefill: p50 / p90 / p99 / max" in html and "6 of 6" in html
    assert render.remote_references(html) == []
    assert 'src=""' not in html
    assert "Traceback" not in html


def test_a_published_report_names_no_host_and_no_command_line(db, tmp_path):
    out = tmp_path / "published.html"
    render.render_report(QMD, db, out, engine="fallback", publish=True)
    html = out.read_text()
    assert HOST not in html and "<summary>server command" not in html and "vllm.entrypoints" not in html
    assert "host names and server command lines left out" in html
    assert all(run in html for run in (RUN_A, RUN_LEGACY, RUN_FAILED)) and "tiny-qwen2" in html


def test_non_finite_samples_are_null_counted_and_the_report_renders(tmp_path):
    """Prometheus' text allows NaN and +Inf. The run folder keeps them as the server wrote
    them; every signal reads them as NULL (a gauge at that scrape is unknown, a counter
    skips it), each run counts them, and the report renders."""
    import math

    import pyarrow.parquet as pq

    from filledfirst import atomic
    from filledfirst.run import folder

    from helpers.report_runs import run_a

    run = run_a(tmp_path)
    samples = pq.read_table(run / folder.SAMPLES).to_pylist()
    spoil = {("vllm:kv_cache_usage_perc", "engine=0", 1.0): math.nan,
             ("vllm:num_requests_running", "engine=1", 1.5): math.inf,
             ("vllm:num_preemptions_total", "engine=0", 1.5): math.nan}
    for s in samples:
        s["value"] = spoil.get((s["metric"], s["labels"].split(",")[0], s["t"]), s["value"])
    atomic.write_parquet(pa.Table.from_pylist(samples, schema=SAMPLE_SCHEMA), run / folder.SAMPLES)
    db = report_db(tmp_path / "nan.duckdb", [run])
    with duckdb.connect(str(db), read_only=True) as con:
        stored = con.execute("SELECT count(*) FROM samples WHERE isnan(value) OR isinf(value)").fetchall()[0][0]
        a = signals.run_summary(con).to_dicts()[0]
        series = {(r["signal"], r["t"]): r["value"] for r in signals.timeseries(con, RUN_A).to_dicts()}
    assert stored == 3  # what the server said is what is stored
    assert a["nonfinite_samples"] == 3
    # the scrape with an infinite engine is unknown, not infinite: the maximum is another scrape's
    assert series[("running", 1.5)] is None and series[("kv_pct", 1.0)] is None
    assert a["running_max"] == 4 and a["kv_max_pct"] == pytest.approx(30.0)
    assert a["preemptions"] == 4  # the counter's rise across the NaN still counts
    out = tmp_path / "report.html"
    render.render_report(QMD, db, out, engine="fallback")
    assert "values not finite" in out.read_text()


# --- the browser -----------------------------------------------------------------------------


@pytest.mark.browser
def test_charts_draw_offline(report, chromium, tmp_path):
    run = chromium_run("--dump-dom", report.as_uri(), profile=tmp_path / "profile")
    parser = ChartDivs()
    parser.feed(run.stdout)
    assert len(parser.charts) == 4, parser.charts
    assert all(parser.charts.values()), f"charts without an <svg>: {parser.charts}"
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console  # no error, no warning, nothing fetched
    if os.environ.get("FILLEDFIRST_SCREENSHOT"):  # e.g. =/tmp/report.png to look at it
        png = Path(os.environ["FILLEDFIRST_SCREENSHOT"])
        screenshot(report, png, tmp_path / "profile-shot")
        shutil.copy(report, png.with_suffix(".html"))


def test_schedule_sentence_in_the_seeds_words():
    from filledfirst.report.tables import schedule_sentence

    stats = ScheduleStats.decode({
        "requests": 114, "duration_s": 120.0, "keep_every": 10, "time_scale": 0.5, "clipped": 2, "skipped": 0,
        "prompt_tokens": {"p50": 1029, "p90": 3612, "max": 9000},
        "output_tokens": {"p50": 209, "p90": 429, "max": 652}})
    text = schedule_sentence(stats)
    assert "median prompt about 1,000 tokens, p90 around 3,600, median output about 209" in text
    assert "Every 10th request" in text and "gaps scaled by 0.5" in text and "2 clipped" in text
    assert "skipped" not in text
    assert schedule_sentence(None) == "" and schedule_sentence(ScheduleStats.decode({"requests": 0})) == ""


def test_sweep_chart_draws_and_marks_failed_levels():
    import vl_convert

    from filledfirst.report import charts
    from filledfirst.report.rows import RunRates, SweepLine

    rows = [SweepLine(concurrency=c, run=RunRow(run_id=f"c{c}", n_requests=4 * c, n_failed=int(c == 4),
                                                ttft_p50_ms=10.0 * c),
                      rates=RunRates(run_id=f"c{c}", ttft_p95_ms=15.0 * c, tok_s_per_request=100.0 / c,
                                     total_tok_s=100.0 + c))
            for c in (1, 2, 4)]
    svg = vl_convert.vegalite_to_svg(charts.sweep_chart(rows).to_dict())
    assert svg.count("<path") > 3 and "TTFT against concurrency" in svg
    html = tables.sweep_table(rows)
    assert html.count("<tr>") == 4 and "40.0 ms" in html
    assert html.count(tables.NOT_REPORTED) == 6  # no per-request timings from the server, no diagnosis
    html = tables.sweep_table([msgspec.structs.replace(r, queue_share=0.1 * r.concurrency,
                                                       label=f"label {r.concurrency}") for r in rows])
    assert tables.NOT_REPORTED not in html and "queue share of TTFT" in html and "40 %" in html
    assert "what filled first" in html and "label 4" in html


def test_goodput_chart_marks_runs_with_failures():
    import vl_convert

    from filledfirst.contracts.diagnosis import DiagnosisRow
    from filledfirst.report import charts
    from filledfirst.report.rows import RunRates

    rows = [(DiagnosisRow(run_id=e, experiment=e, goodput_rps=goodput, slo_met_share=met),
             RunRates(run_id=e, offered_rps=offered, n_failed=failed))
            for e, offered, goodput, failed, met in (("a", 2.0, 1.9, 0, 0.95), ("b", 4.0, 0.5, 3, 0.1))]
    spec = charts.goodput_chart(rows).to_dict()
    svg = vl_convert.vegalite_to_svg(spec)
    assert "Goodput against offered load" in svg and charts.FAILED_COLOR in svg


def test_request_path_by_hand(con):
    from filledfirst.analysis import request_path

    parts = request_path.ttft_parts(con, RUN_A).to_dicts()
    assert [(r["role"], r["q"]) for r in parts] == [("decoding", 0.5), ("decoding", 0.9), ("probe", 0.5),
                                                     ("probe", 0.9)]
    dec50 = parts[0]  # the middle decoding request: TTFT 50 ms, 49 from send
    assert dec50["n_band"] == 1 and dec50["ttft_ms"] == pytest.approx(50)
    assert (dec50["dispatch_ms"], dec50["queue_ms"], dec50["prefill_ms"], dec50["front_end_ms"]) == (
        pytest.approx(1), pytest.approx(24.5), pytest.approx(19.6), pytest.approx(4.9))
    assert request_path.ttft_parts(con, RUN_LEGACY)["n_timed"].to_list() == [0, 0]
    shares = {r["run_id"]: r["queue_share"] for r in request_path.queue_shares(con).to_dicts()}
    # (half of each TTFT from send) / TTFT from arrival, summed over the six
    assert shares[RUN_A] == pytest.approx(0.5 * (1260 - 6) / 1260) and shares[RUN_LEGACY] is None


def test_ttft_parts_chart_draws_a_bar_per_role_and_quantile():
    import vl_convert

    from filledfirst.report import charts
    from filledfirst.report.rows import TtftPart

    rows = [TtftPart(run_id="r", role=role, q=q, n_ok=10, n_timed=10 if role == "probe" else 0, n_band=2,
                     ttft_q_ms=100.0, ttft_ms=100.0, dispatch_ms=1.0, front_end_ms=4.0, queue_ms=80.0,
                     prefill_ms=15.0) for role in ("probe", "decoding") for q in (0.5, 0.9)]
    svg = vl_convert.vegalite_to_svg(charts.ttft_parts_chart(rows).to_dict())
    assert "Where TTFT went" in svg and "server queue" in svg and "probe p90" in svg
    assert "decoding p50" not in svg  # a role without timings has no bar
    text = tables.ttft_parts_sentence(rows)
    assert text == f"TTFT parts from vLLM's per-request timings of 10 of 20 successful requests. decoding: " \
                   f"{tables.NOT_REPORTED}."


def test_a_schedule_placed_relative_to_a_knee_says_where_it_was_placed():
    """The reader sees the rate a run was offered as the multiple of a measured knee it is."""
    from filledfirst.report.tables import schedule_sentence

    stats = ScheduleStats.decode({
        "requests": 333, "duration_s": 3.1, "prompt_tokens": {"p50": 150, "p90": 150, "max": 150},
        "output_tokens": {"p50": 160, "p90": 160, "max": 160},
        "relative": [{"key": "phases[0].interval_s", "role": "decode", "of": "decode/default", "knee_rps": 53.817,
                      "reason": "converged", "search": "s.json", "times": 2.0, "rate_rps": 107.63,
                      "interval_s": 0.00929}]})
    text = schedule_sentence(stats)
    assert ("Placed relative to a measured knee: the decode requests at 2x the knee of decode/default "
            "(53.8 req/s held): 108 req/s.") in text
    trace = ScheduleStats.decode({
        "requests": 287, "duration_s": 24.0, "keep_every": 10, "time_scale": 0.05,
        "relative": [{"key": "time_scale", "of": "azure/default", "knee_rps": 16.0, "reason": "converged",
                      "search": "s.json", "times": 0.5, "rate_rps": 8.0, "kept_per_s": 0.48, "time_scale": 0.06}]})
    assert "the trace's time scale at 0.5x the knee of azure/default (16 req/s held): 8 req/s, time scale 0.06" \
        in schedule_sentence(trace)


def test_a_schedule_with_shared_prefixes_says_what_an_ideal_cache_would_serve():
    from filledfirst.report.tables import schedule_sentence

    sizes = {"prompt_tokens": {"p50": 1152, "p90": 1152, "max": 1152},
             "output_tokens": {"p50": 16, "p90": 16, "max": 16}}
    synthetic = ScheduleStats.decode({"requests": 200, "duration_s": 2.6, "source": "synthetic", "block_tokens": 1024,
                                      "ideal_hit_share": 0.75, **sizes})
    assert "Prompts share prefixes of 1,024 tokens; an unbounded prefix cache would serve 75 % of their tokens." \
        in schedule_sentence(synthetic)
    trace = ScheduleStats.decode({"requests": 162, "duration_s": 38.0, "source": "conversation_trace.jsonl",
                                  "keep_every": 1, "time_scale": 0.633, "block_tokens": 128, "ideal_hit_share": 0.053,
                                  **sizes})
    text = schedule_sentence(trace)
    assert "Every request of the trace window, gaps scaled by 0.633." in text and "1th" not in text
    assert "Prompts share prefix blocks of 128 tokens as the trace's do; an unbounded prefix cache would serve 5 %" \
        in text


# --- the study's parts -----------------------------------------------------------------------


def test_the_schemas_rows_are_the_reports():
    import yaml

    from filledfirst.config import SCHEMA_PATH
    from filledfirst.report import parts

    schema = yaml.safe_load(SCHEMA_PATH.read_text())["properties"]["sections"]["oneOf"][1]
    assert schema["additionalProperties"]["properties"]["rows"]["items"]["enum"] == list(parts.ROWS)
    assert set(parts.DEFAULT_ROWS) <= set(parts.ROWS)


def test_a_study_with_sections_of_its_own(tmp_path, db):
    """A section the original study does not have goes through the config, the diagnosis
    and the report: its own title and rows, reference figures beside; a run whose section
    the database does not describe still gets a table, under its section's name."""
    import yaml

    from filledfirst.report import parts
    from filledfirst.store.study_parts import stored_parts

    base = yaml.safe_load((REPO / "tests" / "configs" / "e2e.yaml").read_text())
    base["sections"] = {"warm_up": {"title": "Does a cold server differ?", "rows": ["ttft_p90", "running_max"],
                                 "reference": {"last week": {"ttft_p90": "90 ms"}}}}
    for exp in base["experiments"].values():
        exp["section"] = "warm_up"
    config = tmp_path / "own.yaml"
    config.write_text(yaml.safe_dump(base, sort_keys=False))
    study = load_study([config])
    assert list(study.sections) == ["warm_up"] and study.sections["warm_up"].table == "signals"
    base["experiments"]["reference"]["section"] = "nope"
    config.write_text(yaml.safe_dump(base, sort_keys=False))
    with pytest.raises(Exception, match=r"experiments.reference.section: 'nope' is not in sections \(\['warm_up'\]\)"):
        load_study([config])

    own = tmp_path / "own.duckdb"
    shutil.copyfile(db, own)
    write_diagnosis(own, DiagnosisRules(), parts=study.sections)
    with duckdb.connect(str(own), read_only=True) as c:
        assert stored_parts(c) == study.sections
        summary = [r for r in RunRow.of(signals.run_summary(c)) if r.n_requests]
        metas = signals.run_metas(c)
    part_of = {RUN_A: "warm_up", RUN_LEGACY: "decode_load"}
    blocks = parts.parts_html(study.sections, summary, part_of, roles=[], rates={}, queue_shares={}, metas=metas,
                             prefix_cache={}, frontier_rows=[], labels={})
    html = "".join(blocks)
    assert html.index("Does a cold server differ?") < html.index("decode_load")  # the study's, then the rest
    own_table = blocks[1]
    assert "TTFT p90" in own_table and "running (max)" in own_table and "TTFT p50" not in own_table
    assert "last week" in own_table and "90 ms" in own_table
    assert "running (median / max)" in html  # the general rows for the part not described


def test_the_run_chart_colours_the_waiting_by_what_held_it():
    import polars as pl
    import vl_convert

    from filledfirst.report import charts

    points = pl.DataFrame({"request_id": [1], "t_scheduled": [0.0], "ttft_ms": [10.0], "role": ["r"],
                           "status": ["ok"], "error": [None]})
    series = pl.DataFrame({"t": [0.0, 0.25, 0.5] * 3, "signal": ["running"] * 3 + ["waiting"] * 3 + ["kv_pct"] * 3,
                           "value": [8.0, 8.0, 8.0, 0.0, 3.0, 2.0, 10.0, 10.0, 10.0]})
    held = pl.DataFrame({"t": [0.25, 0.5], "constraint": ["cap", "KV blocks"], "waiting": [3.0, 2.0]})
    svg = vl_convert.vegalite_to_svg(charts.run_chart(points, series, 8, held).to_dict())
    assert "waiting, held by" in svg and "KV blocks" in svg and "token budget" in svg  # the whole legend
    # not diagnosed yet: the waiting gauge alone
    svg = vl_convert.vegalite_to_svg(charts.run_chart(points, series, 8, held.clear()).to_dict())
    assert "held by" not in svg


def test_the_step_time_chart_draws_the_fit_against_the_intervals():
    import polars as pl
    import vl_convert

    from filledfirst.report import charts

    points = pl.DataFrame({"setting": ["decode/default", "decode/default", "kv/kv160"], "modelled_ms": [4.0, 6.0, 9.0],
                           "measured_ms": [4.2, 5.5, 12.0], "steps": [20.0, 30.0, 10.0]})
    svg = vl_convert.vegalite_to_svg(charts.step_time_chart(points).to_dict())
    assert "step the model gives (ms)" in svg and "kv/kv160" in svg and "decode/default" in svg
