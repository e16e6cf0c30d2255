"""The report's capacity-search part and its summary, on synthetic probe runs in DuckDB
(helpers/searches.py's probes, helpers/synthetic_db.py's designed runs), and the rendered report
with the frontier chart drawn in headless Chromium."""

from __future__ import annotations

import json
import re
from html import unescape

import duckdb
import msgspec
import pytest
import vl_convert

from filledfirst.analysis.diagnosis import write_diagnosis
from filledfirst.analysis.frontiers import write_frontiers
from filledfirst.contracts.diagnosis import DiagnosisRow
from filledfirst.contracts.frontiers import Confirmation, FrontierRow, Intervention
from filledfirst.report import charts, frontiers, markup, render, sections
from filledfirst.report.data import load
from filledfirst.study import DiagnosisRules

from helpers.chromium import ChartDivs, chromium_run
from helpers.report_runs import QMD
from helpers.searches import SEQ8_SEARCH, SLO, cap_probes
from helpers.synthetic_db import every, gauges, make_db, queue, reference_run

PROBE_ERROR = "server exited with code -9 <b>boom</b>"


def row(**columns) -> FrontierRow:
    """A row of table `frontiers` from the columns a test names (the rest NULL)."""
    return FrontierRow.from_columns({"frontier": "f", "setting": "s", "slo_ttft_ms": 500.0, "slo_itl_ms": 100.0,
                                     "probes": 1, **columns})


def failed_probe(frontier, setting, probe, rate):
    block = {"name": frontier, "setting": setting, "probe": probe, "rate": rate, "probe_s": 20, "slo": SLO,
             "target": 0.95, "requests": None, "attainment": None, "held": None, "missed": None,
             "error": PROBE_ERROR}
    return {"run_id": f"{frontier}/{setting}/p{probe:02d}-x", "status": "failed", "error": PROBE_ERROR,
            "requests": [], "samples": [], "meta": {"workload": "light", "part": "frontier", "frontier": block}}


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    ref = reference_run("ref")
    ref["meta"] = {"part": "decode_load", "expect": "reference"}
    lim_reqs = queue(every(0.1, 200), 1.2, 8)  # 10 arrivals/s against 8 slots of 1.2 s
    lim = {"run_id": "lim", "cap": 8, "requests": lim_reqs, "samples": gauges(lim_reqs, 32, lambda n: 1.5 * n),
           "meta": {"part": "sequence_limit", "expect": "KV-capacity pressure"}}  # designed for another
    runs = [ref, lim, *cap_probes(), failed_probe("cap", "slow", 3, 1.414)]
    path = make_db(tmp_path_factory.mktemp("fr") / "f.duckdb", runs)
    search = SEQ8_SEARCH
    with duckdb.connect(str(path)) as con:
        con.execute("INSERT INTO frontier_searches VALUES (?, ?, ?)", ["cap", "seq8", json.dumps(search)])
    write_diagnosis(path, DiagnosisRules())
    write_frontiers(path)
    return path


@pytest.fixture(scope="module")
def con(db):
    c = duckdb.connect(str(db), read_only=True)
    yield c
    c.close()


def test_probe_points_from_the_runs_in_duckdb(con):
    points = {(p.setting, p.probe.probe): p for p in frontiers.probe_points(con)}
    assert set(points) == {("seq8", 1), ("seq8", 2), ("seq8", 3), ("seq8", 4), ("slow", 1), ("slow", 2),
                           ("slow", 3)}
    assert points[("seq8", 3)].probe.attainment == 0.3 and points[("seq8", 3)].probe.held is False
    assert not points[("seq8", 3)].failed
    slow2, slow3 = points[("slow", 2)], points[("slow", 3)]
    assert slow2.failed and not slow2.outright and slow2.n_failed == 1  # a failed request
    assert slow3.outright and slow3.probe.attainment is None and slow3.probe.error == PROBE_ERROR


def test_leading_signal_and_its_lead():
    r = row(hi_rps=8.0, waiting_from_rps=4.0, cap_from_rps=4.0, kv_full_from_rps=8.0)
    assert frontiers.leading_signal(r) == (["waiting > 0", "running at the cap"], 4.0, 2.0)
    assert frontiers.leading_text(r) == "waiting > 0 and running at the cap from 4 req/s: 2x ahead of the " \
                                          "break at 8 req/s"
    assert frontiers.leading_signal(row(hi_rps=8.0, kv_full_from_rps=2.0)).signals == ["KV full"]
    assert frontiers.leading_text(row(hi_rps=8.0, cap_from_rps=8.0)).endswith("at the break itself, no warning")
    assert frontiers.leading_text(row(hi_rps=4.0, cap_from_rps=8.0)).endswith("only after the break at 4 req/s")
    assert frontiers.leading_text(row(hi_rps=None, waiting_from_rps=3.0)).endswith("(the SLO never broke)")
    assert frontiers.leading_text(row(hi_rps=2.0)) == "none crossed at any probed rate"


@pytest.mark.parametrize(("label", "words"), [
    ("active-sequence limit", "max_num_seqs"),
    ("KV-capacity pressure", "max_model_len"),
    ("prefill-decode interference", "max_num_batched_tokens"),
    ("prefill token budget", "a larger per-step token budget"),
    ("ITL-bound", "more compute or a smaller batch"),
    ("compute-bound", "faster steps: more compute"),
    ("unclassified", "read the clue"),
    ("failed", "failed outright"),
])
def test_what_would_move_the_knee(label, words):
    assert words in frontiers.move_the_knee(row(hi_rps=2.0, knee_label=label))


def test_nothing_broke_means_raise_the_maximum():
    assert "maximum" in frontiers.move_the_knee(row(hi_rps=None, knee_label=None))


def test_frontier_table_per_setting(con):
    rows = frontiers.frontier_rows(con)
    assert [(r.frontier, r.setting) for r in rows] == [("cap", "seq8"), ("cap", "slow")]
    html = frontiers.frontier_table_html(rows)
    assert html.count("<tr>") == 3
    assert ("<td>5.66 req/s</td><td>8 req/s</td><td>5.14 to 8 req/s (90 %)</td>"
            "<td>DRIFTED: -14 % (6.6 req/s before, 5.7 req/s after), measure again on a quiet server</td>"
            "<td>active-sequence limit</td>") in html
    assert "<td>1 req/s</td><td>2 req/s</td><td>—</td><td>—</td>" in html  # no search.json: no interval
    # output tokens/s beside the rate when the runs measured it (these synthetic runs did not)
    assert "5.66 req/s (1,234 output tok/s)" in frontiers.frontier_table_html(
        [msgspec.structs.replace(rows[0], lo_output_tok_s=1234.4)])
    assert "the cap held 100 % of the waiting" in html  # the knee's clue
    assert "waiting &gt; 0 and running at the cap from 8 req/s: at the break itself" in html
    assert "more sequences (max_num_seqs)" in html and "ITL-bound" in html and "budget" in html


def test_frontier_chart_draws_the_knee_and_the_failed_probe(con):
    (name, rows, points), = frontiers.by_frontier(frontiers.frontier_rows(con), frontiers.probe_points(con))
    spec = frontiers.frontier_chart(rows, points).to_dict()
    svg = vl_convert.vegalite_to_svg(spec)
    assert name == "cap" and "Attainment against offered rate: cap" in svg
    assert charts.FAILED_COLOR in svg and "2 probe(s) with failures" in svg
    # the knee's bracket: one rect per setting with both edges (seq8: 5.657 to 8; slow: 1 to 2)
    rect = next(layer for layer in spec["layer"] if layer["mark"]["type"] == "rect")
    assert sorted((d["lo"], d["hi"]) for d in spec["datasets"][rect["data"]["name"]]) == [(1.0, 2.0), (5.657, 8.0)]
    # each measured probe shaped by what decided it: seq8 held at 2, 4, 5.657 and broke on
    # its attainment at 8
    dots = next(layer for layer in spec["layer"] if layer["mark"]["type"] == "point" and "shape" in layer["encoding"])
    decided = {(d["setting"], d["rate"]): d["decided"] for d in spec["datasets"][dots["data"]["name"]]}
    assert decided[("seq8", 2.0)] == "held" and decided[("seq8", 8.0)] == "broke: attainment below the target"


def test_a_probe_whose_requests_met_the_slo_broke_on_its_backlog(con):
    point = next(p for p in frontiers.probe_points(con) if p.setting == "seq8" and not p.probe.held)
    grew = msgspec.structs.replace(point, probe=msgspec.structs.replace(
        point.probe, attainment=1.0, attainment_lo=0.97, backlog_growth=0.4))
    assert frontiers.decided(grew) == "broke: its backlog grew"
    assert frontiers.decided(point) == "broke: attainment below the target"


def test_no_frontiers_table_means_nothing(tmp_path):
    path = make_db(tmp_path / "r.duckdb", [reference_run()])
    with duckdb.connect(str(path), read_only=True) as c:
        assert frontiers.frontier_rows(c) == []  # no table at all
    write_diagnosis(path, DiagnosisRules())
    write_frontiers(path)
    with duckdb.connect(str(path), read_only=True) as c:
        assert frontiers.frontier_rows(c) == [] and frontiers.probe_points(c) == []  # an empty one


def test_summary_rows_by_part_and_frontier(con):
    diagnosis = [DiagnosisRow.from_columns(d) for d in con.sql("SELECT * FROM diagnosis").pl().to_dicts()]
    from filledfirst.analysis import signals

    rows = frontiers.summary_rows(diagnosis, signals.run_metas(con), frontiers.frontier_rows(con), DiagnosisRules())
    assert [(r.part, r.what) for r in rows] == [
        ("decode_load", "ref"), ("sequence_limit", "lim"), ("frontier cap", "seq8"), ("frontier cap", "slow")]
    ref, lim, seq8, slow = rows
    assert (ref.found, ref.mark, ref.number) == ("reference", "as designed", "waiting 0 % of the time")
    assert (lim.designed, lim.found, lim.mark) == ("KV-capacity pressure", "active-sequence limit", "DIFFERS")
    assert lim.number == "waiting held by cap 100 %"
    assert (seq8.found, seq8.number) == (
        "active-sequence limit",
        "held 5.66 req/s, broke at 8 req/s; capacity 5.14 to 8 req/s (90 %); drift -14 % (DRIFTED)")
    assert slow.found == "ITL-bound"
    html = frontiers.summary_table(rows)
    assert html.count("<tr>") == 5 and "<strong>differs</strong>" in html
    assert html.count("frontier cap") == 1  # a part named once


def test_at_a_glance_names_the_second_limit_where_two_filled(con):
    diagnosis = [DiagnosisRow.from_columns(d) for d in con.sql("SELECT * FROM diagnosis").pl().to_dicts()]
    from filledfirst.analysis import signals

    lim = next(d for d in diagnosis if d.experiment == "lim")
    both = [msgspec.structs.replace(d, then_filled="KV-capacity pressure at 12.0 s") if d is lim else d
            for d in diagnosis]
    rows = frontiers.summary_rows(both, signals.run_metas(con), [], DiagnosisRules())
    line = next(r for r in rows if r.what == "lim")
    assert line.found == "active-sequence limit, then KV-capacity pressure at 12.0 s"
    assert line.mark == "DIFFERS"  # designed for KV: what filled first is what counts


@pytest.fixture(scope="module")
def report(db, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "report.html"
    render.render_report(QMD, db, out, engine="fallback")
    return out


def test_report_shows_the_frontier_and_the_summary(report):
    html = report.read_text()
    body = html[html.index('<h2 id="At-a-glance">'):]  # "What filled up first?" is the page's title too
    assert body.index("What filled up first") < body.index('<h2 id="Capacity-search">') < body.index("Setup")
    assert '<a href="#Capacity-search">Capacity search</a>' in html  # in the table of contents
    assert "Frontier cap" in html and "what would move the knee" in html and "<strong>differs</strong>" in html
    assert "<b>boom" not in html  # the failed probe's error stays text
    # the 2 designed runs with requests + goodput + the frontier; the probes are drawn in
    # the frontier chart and folded per search, without a section of their own
    assert html.count('class="ff-chart"') == 4
    assert "<summary>seq8: its 4 probes, 2 req/s to 8 req/s</summary>" in html
    assert "<summary>slow: its 3 probes, 1 req/s to 2 req/s</summary>" in html
    # their run.json's part `frontier` is no part of the study: no table of its own, no
    # probe anywhere but under Capacity search
    assert "<h3>frontier</h3>" not in html
    outside = html[:html.index('<h2 id="Capacity-search">')] + html[html.index('<h2 id="Setup">'):]
    assert "cap/seq8/p" not in outside and "cap/slow/p" not in outside


def test_each_search_folds_a_line_per_probe(con):
    data = load(con)
    blocks = sections.capacity_search(data)
    folded = [b for b in blocks if b.startswith("<details>")]
    assert [b[:b.index("</summary>")].removeprefix("<details><summary>") for b in folded] == [
        "seq8: its 4 probes, 2 req/s to 8 req/s", "slow: its 3 probes, 1 req/s to 2 req/s"]
    labels = {d.run_id: d.label for d in data.diagnosis}
    for block, points in zip(folded, [[p for p in data.probe_points if p.setting == s] for s in ("seq8", "slow")]):
        probe_table = block[:block.index("</table>")]
        lines = re.findall(r"<tr><th scope='row'>(\d+)</th>(.*?)</tr>", probe_table)
        assert [int(n) for n, _ in lines] == sorted(p.probe.probe for p in points)  # a line per probe, in order
        assert all(p.run_id in probe_table and markup.esc(labels[p.run_id]) in probe_table for p in points)
    slow = folded[1][:folded[1].index("</table>")]
    cells = [re.findall(r"<td>(.*?)</td>", line) for line in slow.split("</tr>")]
    p02 = next(c for c in cells if c and c[0] == "2 req/s")
    # rate, length, requests, attainment, its interval, backlog growth, verdict, lifetime, label,
    # failed / over TTFT / over ITL, run
    assert p02[1:7] == ["20.0 s", "40", "25.0 %", "15.6 to 37.6 %", "+0.000 s/s", "broke"]
    assert p02[-4:-1] == ["1", "2", "27"]
    p03 = next(c for c in cells if c and c[0] == "1.41 req/s")
    assert p03[3:7] == ["—", "—", "—", "failed: " + markup.esc(PROBE_ERROR)] and p03[-4:-1] == ["—", "—", "—"]
    # the probes' evidence and measurement checks fold with them
    assert all("first crossings" in b and "dispatch lag" in b for b in folded)


@pytest.mark.browser
@pytest.mark.usefixtures("chromium")  # skips (or fails in CI) without Chromium
def test_frontier_chart_draws_offline(report, tmp_path):
    run = chromium_run("--dump-dom", report.as_uri(), profile=tmp_path / "profile")
    parser = ChartDivs()
    parser.feed(run.stdout)
    assert len(parser.charts) == 4 and all(parser.charts.values()), parser.charts
    assert "Attainment against offered rate: cap" in run.stdout
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console


def test_what_moved_the_knee_and_the_verdict_at_a_glance():
    base = {"frontier": "decode", "reason": "converged", "confidence": 0.9, "knob": None, "parent": None,
            "relaxed_from": None, "relaxed_to": None, "role": None, "shift": None, "moved": None,
            "verdict": None, "verdict_why": None, "next_label": None, "hi_inconclusive": False, "drift": None}
    rows = [row(**r) for r in [
        {**base, "setting": "seq8", "lo_rps": 10.0, "hi_rps": 11.0, "floor_rps": 9.5, "drift": -0.16,
         "knee_label": "active-sequence limit", "verdict": "confirmed",
         "verdict_why": "relaxing max_num_seqs moved the knee above its interval; the control did not",
         "next_label": "compute-bound"},
        {**base, "setting": "seq8_kv_x2", "lo_rps": 10.5, "hi_rps": 11.5, "floor_rps": 9.8,
         "knee_label": "active-sequence limit", "parent": "seq8", "knob": "KV tokens", "relaxed_from": 153600,
         "relaxed_to": 307200, "role": "control", "shift": 0.32, "moved": "no", "within_drift": True,
         "min_shift": 0.3, "least_shift": 0.508},
        {**base, "setting": "seq8_seqs_x2", "lo_rps": 19.0, "hi_rps": 21.0, "floor_rps": 18.0,
         "knee_label": "compute-bound", "parent": "seq8", "knob": "max_num_seqs", "relaxed_from": 8,
         "relaxed_to": 16, "role": "relaxed", "shift": 0.9, "moved": "up", "within_drift": False,
         "min_shift": 0.3, "least_shift": 0.508},
    ]]
    html = frontiers.moved_table_html(rows)
    lines = [unescape(line) for line in re.findall(r"<tr>(.*?)</tr>", html, re.S)[1:]]
    # the relaxed line first, with the verdict; the control's with its move
    assert "seq8_seqs_x2: max_num_seqs 8 -> 16" in lines[0] and "confirmed: relaxing" in lines[0]
    assert "+90 % (above its interval)" in lines[0] and "compute-bound" in lines[0]
    assert "seq8_kv_x2: KV tokens 153,600 -> 307,200" in lines[1]
    assert "+32 % (within what the server's drift allows)" in lines[1]
    assert "51 % (30 %, widened by the parent's drift of -16 %)" in lines[0]
    assert "9.5 to 11 req/s (90 %)" in lines[0] and "18 to 21 req/s (90 %)" in lines[0]
    glance = frontiers.summary_rows([], {}, rows, DiagnosisRules())
    assert [g.what for g in glance] == ["seq8"]  # the interventions speak through their parent
    assert glance[0].found == "active-sequence limit (confirmed by intervention; next: compute-bound)"


def test_a_knee_above_its_interval_by_less_than_the_least_shift_says_both():
    i = Intervention(parent="p", knob="KV tokens", shift=0.25, moved="no", interval_move="up", within_drift=False)
    assert frontiers._shift(i) == "+25 % (above its interval, less than the least shift that counts)"
    assert frontiers._shift(msgspec.structs.replace(i, interval_move="no")) == "+25 % (within the intervals)"


def test_a_parts_knees_side_by_side_each_against_the_first_setting():
    base = {"frontier": "prefix", "reason": "converged", "confidence": 0.9, "parent": None, "hi_inconclusive": False}
    rows = [row(**r) for r in [
        {**base, "setting": "cache_off", "lo_rps": 42.7, "hi_rps": 45.1, "floor_rps": 38.8,
         "knee_label": "prefill token budget"},
        {**base, "setting": "cache_on", "lo_rps": 125.8, "hi_rps": 133.0, "floor_rps": 114.0,
         "knee_label": "active-sequence limit"},
        {**base, "setting": "cache_on_kv160", "lo_rps": 38.3, "hi_rps": 40.5, "floor_rps": 34.8,
         "knee_label": "prefix-cache eviction"},
        # an intervention of a verified setting is not one of the frontier's own settings
        {**base, "setting": "cache_on_seqs_x2", "lo_rps": 200.0, "hi_rps": 210.0, "floor_rps": 190.0,
         "parent": "cache_on", "knob": "max_num_seqs", "knee_label": None},
    ]]
    html = frontiers.knee_shift_table_html(rows, 0.3)
    lines = re.findall(r"<tr>(.*?)</tr>", html, re.S)[1:]
    assert len(lines) == 3
    assert "the baseline" in lines[0] and "prefill token budget" in lines[0]
    assert "x2.95 (moved up)" in lines[1] and "active-sequence limit" in lines[1]
    # intervals overlap: no move, however the ratio reads
    assert "x0.90 (within the noise)" in lines[2] and "prefix-cache eviction" in lines[2]
    # disjoint intervals but a change below the least that counts
    small = [rows[0], msgspec.structs.replace(rows[1], lo_rps=50.0, hi_rps=52.0, floor_rps=46.0)]
    assert "x1.17 (within the noise)" in frontiers.knee_shift_table_html(small, 0.3)
    assert frontiers.knee_shift_table_html([rows[3]], 0.3) == ""


def test_predicted_against_measured_and_the_predicted_shift():
    base = {"frontier": "decode", "reason": "converged", "confidence": 0.9}
    predicted = {"predicted_rps": 8.0, "predicted_first": "cap", "predicted_next": "KV blocks",
                 "predicted_next_rps": 9.5, "predicted_ratio": 1.25, "model_scope": "setting",
                 "would_take": "+30 %: max_num_seqs x1.6 (or steps x1.3 faster)"}
    rows = [row(**base, setting="seq8", lo_rps=9.5, hi_rps=10.5, knee_label="active-sequence limit", **predicted),
            row(**base, setting="seq8_seqs_x2", lo_rps=15.0, hi_rps=16.0, parent="seq8", knob="max_num_seqs",
                relaxed_from=8, relaxed_to=16, role="relaxed", shift=0.58, moved="up", predicted_shift=0.41),
            row(**base, setting="no_model", lo_rps=1.0, hi_rps=2.0)]
    assert rows[0].prediction is not None and rows[2].prediction is None
    lines = [unescape(line) for line in re.findall(r"<tr>(.*?)</tr>", frontiers.predicted_table_html(rows), re.S)]
    assert len(lines) == 2  # the header and the one setting with a prediction
    assert "cap at 8 req/s" in lines[1] and "KV blocks at 9.5 req/s" in lines[1] and ">1.25<" in lines[1]
    assert "the setting's" in lines[1] and "max_num_seqs x1.6" in lines[1] and "9.99 req/s" in lines[1]
    moved = unescape(frontiers.moved_table_html(rows))
    assert "+58 % (above its interval)" in moved and "+41 %" in moved and "predicted not to" not in moved
    small = Intervention(parent="seq8", knob="KV tokens", predicted_shift=0.02, least_shift=0.3)
    assert frontiers.predicted_shift_text(small) == "+2 % (less than the least shift: predicted not to move it)"
    # relaxed x4 where the original study doubled: what a doubling was predicted to give
    x4 = Intervention(parent="reduced", knob="KV tokens", relaxed_from=1, relaxed_to=4, predicted_shift=0.34,
                      predicted_shift_doubled=0.2, least_shift=0.3)
    assert frontiers.predicted_shift_text(x4) == (
        "+34 %; doubled: +20 % (less than the least shift: predicted not to move it)")



def test_a_paired_check_reads_as_what_relaxing_did():
    paired_text = frontiers.paired_text
    base = Intervention(parent="seq2", knob="max_num_seqs")
    assert paired_text(base) == "—"
    moved = msgspec.structs.replace(base, paired_verdict=Confirmation.CONFIRMED, paired_shift=0.75,
                                    paired_shift_lo=0.73, paired_shift_hi=0.77)
    assert paired_text(moved) == "+75 % (pairs +73 % to +77 %): moved"
    still = msgspec.structs.replace(moved, paired_verdict=Confirmation.NOT_CONFIRMED, paired_shift=-0.1,
                                    paired_shift_lo=-0.12, paired_shift_hi=-0.08)
    assert paired_text(still).endswith(": did not move")
    failed = msgspec.structs.replace(base, paired_verdict=Confirmation.INCONCLUSIVE)
    assert paired_text(failed) == "inconclusive (a block failed)"
    predicted = msgspec.structs.replace(moved, predicted_paired_shift=0.86)
    assert paired_text(predicted) == "+75 % (pairs +73 % to +77 %): moved; predicted +86 %"


def test_an_intervention_judged_side_by_side_alone_says_it_was_not_searched():
    base = {"frontier": "decode", "confidence": 0.9}
    predicted = {"predicted_rps": 8.0, "predicted_first": "cap", "predicted_next": "KV blocks",
                 "predicted_next_rps": 9.5, "predicted_ratio": 1.05, "model_scope": "setting"}
    unsearched = {"reason": "not_searched", "lo_rps": None, "hi_rps": None, "parent": "seq8", "probes": 0}
    rows = [row(**base, reason="converged", setting="seq8", lo_rps=8.4, hi_rps=9.0, floor_rps=8.0,
                knee_label="active-sequence limit", **predicted),
            row(**base, **unsearched, setting="seq8_seqs_x2", knob="max_num_seqs", relaxed_from=8, relaxed_to=16,
                role="relaxed", paired_verdict="confirmed", paired_shift=0.6, paired_shift_lo=0.5,
                paired_shift_hi=0.7, predicted_shift=0.5),
            row(**base, **unsearched, setting="seq8_kv_x2", knob="KV tokens", relaxed_from=1, relaxed_to=2,
                role="control", paired_verdict="not confirmed", paired_shift=0.01, paired_shift_lo=-0.02,
                paired_shift_hi=0.03)]
    lines = [unescape(line) for line in re.findall(r"<tr>(.*?)</tr>", frontiers.moved_table_html(rows), re.S)]
    relaxed, control = lines[1], lines[2]
    assert "not searched" in relaxed and "+60 % (pairs +50 % to +70 %): moved" in relaxed
    # what fills next: only the parent's prediction can say, and the relaxed line says so
    assert "KV blocks at 9.5 req/s (predicted)" in relaxed and "(predicted)" not in control
    # a relaxation predicted to stop short of the next limit: the same limit again
    short = [rows[0], msgspec.structs.replace(rows[1], intervention=msgspec.structs.replace(
        rows[1].intervention, predicted_shift=0.1)), rows[2]]
    assert "cap at 8.8 req/s again (predicted)" in unescape(frontiers.moved_table_html(short))
    table = unescape(frontiers.frontier_table_html(rows))
    assert "not searched: judged side by side with seq8" in table and "nothing broke" not in table

