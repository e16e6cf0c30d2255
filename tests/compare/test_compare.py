"""filledfirst compare on synthetic databases (helpers/synthetic_db.py): the verdicts of
knees and run figures, what is on one side only, the gate and its exit status, the tables,
and the page drawn offline in a real browser. The bootstrap's false-alarm rate and power
are checked on seeded samples of known distributions."""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl
import pytest

from filledfirst.cli import main
from filledfirst.compare import compare
from filledfirst.compare.figures import FIGURES, _quantile, _sample, judge
from filledfirst.compare.gate import reasons
from filledfirst.compare.verdicts import Change
from filledfirst.study import Compare, CompareGate

from helpers.chromium import ChartDivs, chromium_run
from helpers.compare_dbs import KNEE, results_db, study_run
from helpers.synthetic_db import kv_pressure_run, reference_run

RULES = Compare()


@pytest.fixture
def dbs(tmp_path):
    base = results_db(tmp_path / "base.duckdb", [study_run("ref"), study_run("slow"), study_run("gone")], [
        ("decode", "default", 10.0, 11.0, 9.5, "converged", "active-sequence limit", False),
        ("decode", "seq8", 4.0, 4.4, 3.8, "converged", "active-sequence limit", False),
        ("kv", "kv160", 1.6, 1.76, 1.52, "converged", "KV-capacity pressure", False)])
    cand_runs = [study_run("ref"), study_run("slow", ttft_s=0.4, failed=20), study_run("new")]
    cand = results_db(tmp_path / "cand.duckdb", cand_runs, [
        ("decode", "default", 11.0, 12.1, 10.4, "converged", "active-sequence limit", False),  # inside the noise
        ("decode", "seq8", 2.0, 2.2, 1.9, "converged", "active-sequence limit", False),  # halved
        ("kv", "kv320", 2.4, 2.64, 2.28, "converged", "KV-capacity pressure", False)], vllm="0.33.0", host="node-b")
    return base, cand


def test_verdicts_of_knees_runs_and_one_side(dbs):
    c = compare(*dbs, RULES)
    knees = {(k["frontier"], k["setting"]): k for k in c.knees}
    assert set(knees) == {("decode", "default"), ("decode", "seq8")}
    assert knees[("decode", "default")]["verdict"] == Change.SAME  # +10 %, intervals overlap
    seq8 = knees[("decode", "seq8")]
    assert seq8["verdict"] == Change.LOWER and seq8["shift"] == pytest.approx(-0.5)
    assert seq8["label_changed"] is False
    figs = {(r["experiment"], r["figure"]): r for r in c.runs}
    assert len(c.runs) == 2 * len(FIGURES)  # ref and slow on both sides
    assert all(figs[("ref", f.name)]["verdict"] == Change.SAME for f in FIGURES)
    slow = {f: figs[("slow", f)] for f in ("TTFT p50", "TTFT p90", "failed", "SLO attainment")}
    assert slow["TTFT p50"]["verdict"] == Change.HIGHER and slow["TTFT p50"]["change"] == pytest.approx(7.0)
    assert slow["failed"]["verdict"] == Change.HIGHER and slow["failed"]["candidate"] == pytest.approx(0.1)
    assert slow["failed"]["by"] == "difference" and slow["failed"]["change_low"] > 0
    # 0.4 s is within the diagnosis SLO: only the 10 % that failed missed it, a share's change beyond its interval
    met = slow["SLO attainment"]
    assert met["change"] == pytest.approx(-0.1) and met["verdict"] == Change.LOWER and met["by"] == "difference"
    assert figs[("slow", "ITL p50")]["verdict"] == Change.SAME
    sides = {(r["kind"], r["name"], r["side"]) for r in c.one_side}
    assert sides == {("capacity search", "kv/kv160", "baseline"), ("capacity search", "kv/kv320", "candidate"),
                     ("experiment", "gone", "baseline"), ("experiment", "new", "candidate")}
    assert {"key": "versions.vllm_package", "base": "0.32.0", "candidate": "0.33.0"} in c.setup
    assert {"key": "hardware.host", "base": "node-a", "candidate": "node-b"} in c.setup
    n = c.verdicts
    assert sum(n.values()) == len(c.knees) + len(c.runs)


def test_a_published_comparison_names_no_host_and_no_full_path(dbs, tmp_path):
    from filledfirst.compare.page import page_html

    published = compare(*dbs, RULES, publish=True)
    assert [r["key"] for r in published.setup] == ["versions.vllm_package"]
    html = page_html(published, [])
    assert str(tmp_path) not in html and "node-a" not in html
    assert "Comparison: cand.duckdb against base.duckdb" in html  # from the folder both share
    assert str(tmp_path) in page_html(compare(*dbs, RULES), [])  # the private page names them whole


def test_the_gate(dbs):
    c = compare(*dbs, RULES)
    lines = reasons(c, CompareGate())
    assert len(lines) == 1 and lines[0].startswith("knee decode/seq8: 4 -> 2 req/s (-50%)")
    assert reasons(c, CompareGate(knee_drop=0.6)) == []  # a 50 % drop is within a 60 % allowance
    assert reasons(c, CompareGate(knee_drop=None)) == []


def test_a_study_against_itself(dbs):
    c = compare(dbs[0], dbs[0], RULES)
    assert {k["verdict"] for k in c.knees} == {Change.SAME}
    assert {r["verdict"] for r in c.runs} == {Change.SAME}
    assert c.setup == [] and c.one_side == [] and reasons(c, CompareGate()) == []


def test_a_run_offered_more_because_its_knee_moved_is_not_a_change(tmp_path):
    """A run placed at a share of its side's knee offers what that knee gives: at twice the
    rate with every request on time, no figure changed, and the page shows both rates."""
    base = results_db(tmp_path / "a.duckdb", [study_run("ref")], [])
    cand = results_db(tmp_path / "b.duckdb", [study_run("ref", interval_s=0.05)], [])
    c = compare(base, cand, RULES)
    assert {r["figure"]: r["verdict"] for r in c.runs} == {f.name: Change.SAME for f in FIGURES}
    (row,) = c.labels
    assert row["cand_offered_rps"] == pytest.approx(2 * row["base_offered_rps"], rel=0.02)
    assert row["base_offered_rps"] == pytest.approx(10, rel=0.02)


def test_a_run_on_a_drifting_search_server_needs_a_wider_change(tmp_path):
    """A run right after a search, on its server, shares the search's drift: TTFT x1.6 is a
    change on a steady server, none on one whose speed moved by half over the search."""
    def side(path, ttft_s, drift):
        run = study_run("ref", ttft_s=ttft_s)
        run["meta"]["server"] = {"after_search": "knee/capped"}
        results_db(path, [run], [])
        with duckdb.connect(str(path)) as con:
            con.execute("ALTER TABLE frontiers ADD COLUMN drift DOUBLE")
            con.execute(f"INSERT INTO frontiers ({KNEE}, drift) VALUES ('knee', 'capped', 4.0, 4.4, 3.8, "
                        "'converged', 'active-sequence limit', false, ?)", [drift])
        return path

    steady = compare(side(tmp_path / "a.duckdb", 0.05, None), side(tmp_path / "b.duckdb", 0.08, 0.0), RULES)
    ttft = next(r for r in steady.runs if r["figure"] == "TTFT p50")
    assert ttft["verdict"] == Change.HIGHER and ttft["min_change"] == pytest.approx(0.5)
    drifting = compare(tmp_path / "a.duckdb", side(tmp_path / "c.duckdb", 0.08, -0.5), RULES)
    ttft = next(r for r in drifting.runs if r["figure"] == "TTFT p50")
    assert ttft["change"] == pytest.approx(0.6, rel=0.05)
    assert ttft["verdict"] == Change.SAME and ttft["min_change"] == pytest.approx(1.5 * 1.5 - 1)
    assert (drifting.labels[0]["base_drift"], drifting.labels[0]["cand_drift"]) == (None, -0.5)
    assert next(r for r in drifting.runs if r["figure"] == "failed")["min_change"] is None  # a share


def test_a_changed_label_fails_the_gate(tmp_path):
    knee = ("d", "s", 4.0, 4.4, 3.8, "converged")
    base = results_db(tmp_path / "a.duckdb", [study_run("ref")], [(*knee, "active-sequence limit", False)])
    cand = results_db(tmp_path / "b.duckdb", [study_run("ref")], [(*knee, "compute-bound", False)])
    c = compare(base, cand, RULES)
    assert reasons(c, CompareGate()) == ["knee d/s: what filled first changed, active-sequence limit -> compute-bound"]
    assert reasons(c, CompareGate(label_change=False)) == []


@pytest.mark.parametrize("seed", range(3))
def test_the_bootstrap_false_alarms_and_power(seed):
    """Two samples of one distribution: no change in (nearly) every pair even with no
    minimum change; a 30 % shift of the same spread is found in (nearly) every pair."""
    rng = np.random.default_rng(seed)
    strict = Compare(knee_min_shift=0.3, run_min_change=0.0, confidence=0.95, resamples=200)
    fig = next(f for f in FIGURES if f.name == "TTFT p50")

    def sample(scale):
        v = rng.lognormal(np.log(100 * scale), 0.3, 200)
        return _sample(v, np.arange(len(v)), _quantile(0.5))

    alarms = sum(judge(fig, sample(1.0), sample(1.0), strict).verdict != Change.SAME for _ in range(20))
    found = sum(judge(fig, sample(1.0), sample(1.3), strict).verdict == Change.HIGHER for _ in range(20))
    assert alarms <= 3 and found >= 18, (alarms, found)


def test_cli_exit_status_tables_and_page(dbs, tmp_path, capsys):
    out, db = tmp_path / "compare.html", tmp_path / "compare.duckdb"
    assert main(["compare", str(dbs[0]), str(dbs[1]), "--out", str(out), "--db", str(db)]) == 1
    assert "gate: knee decode/seq8" in capsys.readouterr().err
    assert main(["compare", str(dbs[0]), str(dbs[1]), "--out", str(out), "--no-fail"]) == 0
    assert main(["compare", str(dbs[0]), str(dbs[1]), "--out", str(out), "--knee-drop", "0.6"]) == 0
    with duckdb.connect(str(db), read_only=True) as con:
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        knees = pl.from_arrow(con.sql("SELECT * FROM compare_knees").to_arrow_table())
    assert tables == {"compare_setup", "compare_knees", "compare_runs", "compare_labels", "compare_one_side",
                      "compare_about"}
    assert knees.filter(pl.col("setting") == "seq8")["verdict"].to_list() == ["lower"]
    text = out.read_text()
    assert "The gate passes" in text and "CHANGED" not in text and "kv/kv320" in text
    assert main(["compare", str(tmp_path / "nothing"), str(dbs[1]), "--out", str(out)]) == 2


@pytest.mark.browser
@pytest.mark.usefixtures("chromium")
def test_the_page_draws_offline(dbs, tmp_path):
    out = tmp_path / "compare.html"
    main(["compare", str(dbs[0]), str(dbs[1]), "--out", str(out), "--no-fail"])
    run = chromium_run("--dump-dom", out.as_uri(), profile=tmp_path / "profile")
    parser = ChartDivs()
    parser.feed(run.stdout)
    assert len(parser.charts) == 2 and all(parser.charts.values()), parser.charts
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console


@pytest.mark.parametrize("expect", [None, "KV-capacity pressure"])
def test_a_run_label_change_fails_the_gate_only_for_a_designed_run(tmp_path, expect):
    """A run designed for nothing (a sweep point, a replay) may change its label between two
    nights: it is marked on the page, and fails the gate only when the run had an `expect`."""
    base, cand = kv_pressure_run("kv"), reference_run("kv")
    for run in (base, cand):
        run["meta"] = {"part": "kv", **({"expect": expect} if expect else {})}
    a = results_db(tmp_path / "a.duckdb", [base], [])
    b = results_db(tmp_path / "b.duckdb", [cand], [])
    c = compare(a, b, RULES)
    (row,) = c.labels
    assert (row["base_label"], row["cand_label"], row["label_changed"]) == (
        "KV-capacity pressure", "reference", True)
    expected = ["run kv: what filled first changed, KV-capacity pressure -> reference"] if expect else []
    assert reasons(c, CompareGate()) == expected


def test_a_drifting_search_widens_the_least_shift_that_counts():
    """The same study twice on a VM whose speed moved by 50 % over the second search:
    12.5 then 19.1 req/s (+53 %) is no change; the same knees with no drift are higher."""
    from msgspec.structs import replace

    from filledfirst.compare.knees import knee_row
    from filledfirst.contracts.frontiers import FrontierRow

    knee = {"frontier": "knee", "setting": "capped", "slo_ttft_ms": 500.0, "slo_itl_ms": 100.0, "probes": 4,
            "reason": "converged"}
    base = FrontierRow(**knee, lo_rps=12.5, hi_rps=13.2, floor_rps=11.4, drift=0.07)
    cand = FrontierRow(**knee, lo_rps=19.1, hi_rps=20.2, floor_rps=17.4, drift=0.50)
    row = knee_row(("knee", "capped"), base, cand, RULES)
    assert row["min_shift"] == pytest.approx(1.5 * 1.07 * 1.5 - 1) and row["verdict"] == Change.SAME
    still = knee_row(("knee", "capped"), replace(base, drift=None), replace(cand, drift=None), RULES)
    assert still["min_shift"] == pytest.approx(0.5) and still["verdict"] == Change.HIGHER


def test_the_gate_fails_on_a_drop_below_the_interval_the_page_does_not_call_lower(tmp_path):
    # 20 % lower, both intervals apart: below the 50 % a page's `lower` needs, above the
    # gate's 10 %; the same drop within a 30 % drift of the searches' servers is none
    knee = ("decode", "seq8", 4.0, 4.4, 3.8, "converged", "active-sequence limit", False)
    base = results_db(tmp_path / "a.duckdb", [study_run("ref")], [knee])
    cand = results_db(tmp_path / "b.duckdb", [study_run("ref")], [("decode", "seq8", 3.2, 3.5, 3.1, *knee[5:])])
    c = compare(base, cand, RULES)
    (row,) = c.knees
    assert row["verdict"] == Change.SAME and row["shift"] == pytest.approx(-0.2)
    (line,) = reasons(c, CompareGate())
    assert line.startswith("knee decode/seq8: 4 -> 3.2 req/s (-20%), below the baseline's interval")
    assert reasons(c, CompareGate(knee_drop=0.3)) == []
    with duckdb.connect(str(cand)) as con:
        con.execute("ALTER TABLE frontiers ADD COLUMN drift DOUBLE DEFAULT 0.3")
    assert reasons(compare(base, cand, RULES), CompareGate()) == []
