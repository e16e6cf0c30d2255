"""Table `frontiers` from synthetic probe runs in DuckDB (helpers/synthetic_db.py makes
runs whose requests and gauges agree): the bracket, the knee's label, first crossings."""

from __future__ import annotations

import json

import duckdb
import msgspec
import pytest

from filledfirst.analysis import signals
from filledfirst.analysis.diagnosis import write_diagnosis
from filledfirst.analysis.frontiers import frontier_table, write_frontiers
from filledfirst.cli import main
from filledfirst.contracts.search import Intervention, Knob
from filledfirst.study import DiagnosisRules

from helpers.searches import SEQ8_SEARCH, cap_probes, probe_run, search_record
from helpers.synthetic_db import make_db


@pytest.fixture
def db(tmp_path):
    path = make_db(tmp_path / "f.duckdb", cap_probes())
    search = SEQ8_SEARCH
    with duckdb.connect(str(path)) as con:
        con.execute("INSERT INTO frontier_searches VALUES (?, ?, ?)", ["cap", "seq8", json.dumps(search)])
    write_diagnosis(path, DiagnosisRules())
    return path


def test_the_bracket_and_what_filled_first_at_the_knee(db):
    with duckdb.connect(str(db), read_only=True) as con:
        table = {(r["frontier"], r["setting"]): r for r in frontier_table(con).to_dicts()}
        rates = {r["run_id"]: r for r in signals.run_rates(con).to_dicts()}
        diag = {r[0]: r[1] for r in con.execute("SELECT run_id, label FROM diagnosis").fetchall()}
    seq8 = table[("cap", "seq8")]
    assert (seq8["lo_rps"], seq8["hi_rps"], seq8["reason"], seq8["probes"]) == (5.657, 8.0, "budget", 4)
    assert seq8["lo_run_id"] == "cap/seq8/p04-x" and seq8["knee_run_id"] == "cap/seq8/p03-x"
    assert (seq8["lo_attainment"], seq8["hi_attainment"]) == (0.97, 0.3)
    lo_rates, hi_rates = rates["cap/seq8/p04-x"], rates["cap/seq8/p03-x"]
    assert seq8["lo_offered_rps"] == lo_rates["offered_rps"] == pytest.approx(5.657, rel=0.01)
    assert seq8["lo_goodput_rps"] == pytest.approx(0.97 * lo_rates["offered_rps"])
    assert seq8["hi_goodput_rps"] == pytest.approx(0.3 * hi_rates["offered_rps"])
    assert seq8["hi_output_tok_s"] == hi_rates["total_tok_s"]
    assert seq8["knee_label"] == diag["cap/seq8/p03-x"] == "active-sequence limit"
    assert seq8["knee_clue"].startswith("the cap held 100 % of the waiting (running at most 8 of 8")
    # the cap and a queue first at 8 req/s (5.657: 6.8 in flight of 8, under the 90 % mark)
    assert seq8["waiting_from_rps"] == seq8["cap_from_rps"] == seq8["ttft_p95_from_rps"] == 8.0
    assert seq8["kv_full_from_rps"] is None

    slow = table[("cap", "slow")]
    # no search.json ingested: the bracket from the probes, no stop reason
    assert (slow["lo_rps"], slow["hi_rps"], slow["reason"]) == (1.0, 2.0, None)
    assert diag["cap/slow/p02-x"] == "reference"  # the diagnosis sees nothing filled ...
    assert slow["knee_label"] == "ITL-bound"  # ... the frontier names why the SLO broke
    assert "27 over the ITL SLO, 2 over the TTFT SLO, 1 failed" in slow["knee_clue"]
    assert slow["waiting_from_rps"] is None and slow["cap_from_rps"] is None
    assert (slow["slo_ttft_ms"], slow["slo_itl_ms"], slow["target"]) == (500.0, 100.0, 0.95)


def test_a_probe_measured_again_counts_once_its_latest_run(db, tmp_path):
    again = probe_run("cap", "slow", 2, 2.0, 0.5, 64, 0.5, missed={"failed": 0, "ttft": 20, "itl": 0})
    again["run_id"] = "cap/slow/p02-y"
    with duckdb.connect(str(db)) as con:
        con.execute("INSERT INTO runs (run_id, experiment, status, started_at, max_num_seqs, meta) "
                    "VALUES (?, ?, 'ok', '2026-01-02T00:00:00', 64, ?)",
                    [again["run_id"], again["run_id"], json.dumps(again["meta"])])
        table = {(r["frontier"], r["setting"]): r for r in frontier_table(con).to_dicts()}
    slow = table[("cap", "slow")]
    assert slow["probes"] == 2 and slow["hi_attainment"] == 0.5 and slow["knee_run_id"] == "cap/slow/p02-y"


def test_diagnose_writes_the_frontiers_table(db, capsys):
    assert main(["diagnose", "--db", str(db)]) == 0
    assert "frontier cap/seq8: held 5.657 req/s, broke 8.0 req/s (budget); at the knee: active-sequence limit" \
        in capsys.readouterr().out
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM frontiers").fetchall()[0][0] == 2


def test_a_study_without_searches_gets_an_empty_table(tmp_path):
    from helpers.synthetic_db import reference_run

    path = make_db(tmp_path / "r.duckdb", [reference_run()])
    write_diagnosis(path, DiagnosisRules())
    assert write_frontiers(path).height == 0
    with duckdb.connect(str(path), read_only=True) as con:
        assert "knee_label" in [d[0] for d in con.execute("SELECT * FROM frontiers").description]


def _knee(**probe):
    from filledfirst.contracts.runmeta import FrontierProbe

    base = {"probe": 3, "rate": 2.7, "requests": 52, "met": 52, "attainment": 1.0, "attainment_lo": 0.96,
            "attainment_hi": 1.0, "backlog_growth": 0.14, "verdict": "broke", "held": False, "name": "kv",
            "setting": "kv160", "target": 0.95, "missed": {"failed": 0, "ttft": 0, "itl": 0}}
    return FrontierProbe(**{**base, **probe})


@pytest.mark.parametrize(("held_by", "bound", "label"), [
    ("KV-capacity pressure", "KV blocks 80 %, compute 20 %", "KV-capacity pressure"),
    ("active-sequence limit", "cap 100 %", "active-sequence limit"),
    ("compute-bound", "compute 100 %", "compute-bound"),
])
def test_a_knee_broken_by_its_growing_queue_names_what_held_the_queue(held_by, bound, label):
    """Every request met the SLO and the queue grew: the queue formed late in the probe, too
    little of its window for the run to count as queued (waiting 13 %), and what held the
    waiting the scrapes saw is what filled first, not 'SLO broken with no queue'."""
    from filledfirst.analysis.frontiers import _knee_label
    from filledfirst.contracts.diagnosis import DiagnosisRow

    d = DiagnosisRow(run_id="kv/kv160/p03", experiment="kv/kv160/p03", label="reference", clue="",
                     waiting_share=0.13, held_by=held_by, bound=bound)
    got, clue = _knee_label(d, _knee())
    assert got == label and f"held by {bound}" in clue and "queue grew 0.14 s/s" in clue
    # no scrape saw a request waiting: broken by its TTFT with no queue
    seen_none = msgspec.structs.replace(d, held_by=None, bound=None)
    missed = _knee(attainment=0.5, attainment_lo=0.37, attainment_hi=0.63, missed={"failed": 0, "ttft": 26, "itl": 0})
    assert _knee_label(seen_none, missed)[0] == "compute-bound"
    assert _knee_label(seen_none, _knee(missed={"failed": 0, "ttft": 2, "itl": 20}))[0] == "ITL-bound"


def test_an_intervention_judged_side_by_side_alone_has_a_row_from_its_search_json(db):
    # seq8's cap doubled, not searched (interventions.search false): a search.json with no
    # probes, its paired check moved it +60 % side by side with the cap used beyond 8
    loops = [("relaxed", 16.0, 0.8), ("parent", 10.0, 0.0), ("parent", 10.0, 0.0), ("relaxed", 16.0, 0.7)]
    blocks = [{"side": side, "beyond_share": beyond, "queue_share": 0.0 if side == "relaxed" else 0.9,
               "loop": {"run_dir": f"paired{i}-{side}", "run_id": f"b{i}", "status": "ok", "concurrency": 16,
                        "requests": 120, "throughput_rps": rps}}
              for i, (side, rps, beyond) in enumerate(loops, 1)]
    alone = msgspec.structs.replace(search_record("cap", "seq8_seqs_x2", lo=None, hi=None, reason="not_searched"),
                                    intervention=Intervention(parent="seq8", knob=Knob.SEQS, before=8, after=16,
                                                              changes={"max_num_seqs": 16}, paired=True,
                                                              search=False))
    doc = {**alone.to_doc(), "paired": {"concurrency": 16, "blocks": blocks}}
    stale = probe_run("cap", "seq8_seqs_x2", 1, 9.0, 1.0, 16, 1.2, cap=16)  # of an earlier search of it
    with duckdb.connect(str(db)) as con:
        con.execute("INSERT INTO frontier_searches VALUES (?, ?, ?)", ["cap", "seq8_seqs_x2", json.dumps(doc)])
        con.execute("INSERT INTO runs (run_id, experiment, status, started_at, max_num_seqs, meta) "
                    "VALUES (?, ?, 'ok', '2026-01-02T00:00:00', 16, ?)",
                    [stale["run_id"], stale["run_id"], json.dumps(stale["meta"])])
        table = {(r["frontier"], r["setting"]): r for r in frontier_table(con).to_dicts()}
    row = table[("cap", "seq8_seqs_x2")]
    assert (row["probes"], row["lo_rps"], row["hi_rps"], row["reason"]) == (0, None, None, "not_searched")
    assert (row["parent"], row["role"], row["paired_verdict"]) == ("seq8", "relaxed", "confirmed")
    assert row["paired_shift"] == pytest.approx(0.6) and row["moved"] is None and row["knee_label"] is None
    # no knee searched after seq8's drifting search: the least shift is not widened by that drift
    assert table[("cap", "seq8")]["drift"] < -0.1 and row["least_shift"] == pytest.approx(0.3)
    assert (row["slo_ttft_ms"], row["target"], row["workload"]) == (500.0, alone.bounds.target, "paced")
    # no control measured side by side, and no search to fall back on: nothing decides
    seq8 = table[("cap", "seq8")]
    assert seq8["verdict"] == "inconclusive" and "no search of it to fall back on" in seq8["verdict_why"]
    assert "for the control" in seq8["verdict_why"]
