"""The report's sections (filledfirst.report.sections) on a real DuckDB: the report's
runs of helpers/report_runs.py (ok, cut short, failed) and one capacity-search probe,
ingested and diagnosed."""

from __future__ import annotations

import re

import duckdb
import pytest

from filledfirst.report import markup, sections
from filledfirst.report.data import load
from filledfirst.store.ingest import ingest

from helpers.report_runs import (
    FAILED_RUN_ERROR,
    QMD,
    RUN_A,
    RUN_FAILED,
    RUN_LEGACY,
    make_request,
    report_db,
    report_runs,
    run_meta,
    series,
)
from helpers.run_folder import write_run

PROBE = "cap-default-p01-0"
PROBE_EXPERIMENT = "cap/default/p01"  # the diagnosis' tables name runs by experiment
NO_DIAGNOSIS = markup.para("No diagnosis in this database: run `filledfirst diagnose --db FILE`.")


def probe_run(root):
    """A capacity-search probe, measured on a newer vLLM than the experiments."""
    built = [make_request(0, "probe", 0.0, [(0.1, 1), (0.2, 1)]), make_request(1, "probe", 0.5, [(0.6, 1), (0.7, 1)])]
    ts = [0.0, 0.5, 1.0]
    samples = (series("vllm:num_requests_running", [[1, 1, 0]], ts)
               + series("vllm:num_requests_waiting", [[0, 0, 0]], ts)
               + series("vllm:kv_cache_usage_perc", [[0.1, 0.1, 0.0]], ts))
    meta = run_meta(PROBE, PROBE_EXPERIMENT, "ok", 8, started=4)
    meta["frontier"] = {"name": "cap", "setting": "default", "probe": 1, "rate": 2.0}
    meta["versions"] = {**meta["versions"], "vllm": "0.33.0"}
    return write_run(root / meta["run_id"], meta, [r for r, _ in built], [t for _, toks in built for t in toks],
                     samples)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    db = report_db(root / "study.duckdb", [*report_runs(root), probe_run(root)])
    con = duckdb.connect(str(db), read_only=True)
    yield load(con)
    con.close()


def test_load_tells_the_probes_from_the_experiments(data):
    assert data.is_probe == {PROBE}
    assert [r["run_id"] for r in data.experiments] == [RUN_A, RUN_LEGACY, RUN_FAILED]  # by start time
    assert [r["run_id"] for r in data.probes] == [PROBE]
    assert [r["run_id"] for r in data.measured] == [RUN_A, RUN_LEGACY, PROBE]  # the failed run measured nothing
    assert {d["run_id"] for d in data.diagnosis} == {RUN_A, RUN_LEGACY, RUN_FAILED, PROBE}
    assert data.part_of[RUN_A] == "interference" and list(data.study_parts)


def test_runs_folds_the_probes_away_and_says_why_a_run_is_not_ok(data):
    blocks = sections.runs(data)
    assert blocks[0] == markup.para("4 runs: 2 complete, 1 cut short, 1 failed.")
    experiments, probes = blocks[1], blocks[2]
    assert all(run in experiments for run in (RUN_A, RUN_LEGACY, RUN_FAILED)) and PROBE not in experiments
    assert probes.startswith("<details><summary>") and "probes (1 runs)" in probes and PROBE in probes
    assert blocks[3:] == [markup.para(f"{RUN_LEGACY} was cut short: server exited with code -9"),
                          markup.para(f"{RUN_FAILED} failed: {FAILED_RUN_ERROR}")]
    assert "<script>" not in "".join(blocks)  # the error is text


def test_what_filled_first_lists_the_designed_runs_and_folds_the_probes(data):
    blocks = sections.what_filled_first(data)
    assert "interference" in blocks[0] and "kv-pressure" in blocks[0] and PROBE_EXPERIMENT not in blocks[0]
    folded = [b for b in blocks if b.startswith("<details>")]
    assert [("the capacity searches" in b, "evidence of the probes" in b) for b in folded] == [
        (True, False), (False, True)]
    assert sum(PROBE_EXPERIMENT in b for b in blocks) == 2  # only in the two folded tables


def test_setup_shows_shared_keys_once_and_what_differs_per_run(data):
    by_run, common, differing = sections.shared_setup(data.documents)
    assert common["model.name"] == "tiny-qwen2" and common["hardware.cpu_count"] == 2
    assert differing == ["versions.vllm"] and "versions.vllm" not in common
    assert by_run[PROBE]["versions.vllm"] == "0.33.0"
    blocks = sections.setup(data)
    shared, differs = blocks[0], blocks[1]
    assert "shared by every run" in shared and shared.count("model.name") == 1 and "0.32.0" not in shared
    assert differs.startswith("<details><summary>what differs between runs")
    assert "0.32.0" in differs and "0.33.0" in differs
    assert "server settings, per run (2 keys)" in "".join(blocks)
    commands = [b for b in blocks if "server command" in b]
    assert len(commands) == 3 and not any(PROBE in b for b in commands)  # a probe shares its search's server


def test_each_run_has_a_section_per_experiment_and_none_per_probe(data):
    blocks = sections.each_run(data)
    assert "1 probe runs are listed under Runs" in blocks[0]
    assert [b for b in blocks if b.startswith("<h3>")] == [
        markup.heading(f"{RUN_A} (interference)"), markup.heading(f"{RUN_LEGACY} (decode-legacy)"),
        markup.heading(f"{RUN_FAILED} (kv-pressure)")]
    assert markup.para(f"Nothing was measured. Status failed: {FAILED_RUN_ERROR}") in blocks
    # RUN_A: its TTFT parts and its signals; the legacy run (no server timings): its signals
    assert sum('class="ff-chart"' in b for b in blocks) == 3


def test_side_by_side_and_the_checks_leave_the_probes_out_or_fold_them(data):
    (compare,) = sections.side_by_side(data)
    assert RUN_A in compare and RUN_LEGACY in compare and PROBE not in compare
    table, folded = sections.measurement_checks(data)
    assert RUN_A in table and PROBE not in table and folded.startswith("<details>") and PROBE in folded
    (per_request,) = sections.request_checks(data)
    assert RUN_A in per_request and PROBE not in per_request


def test_a_database_not_yet_diagnosed_says_how_to_diagnose_it(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    ingest(report_runs(root), tmp_path / "bare.duckdb")
    with duckdb.connect(str(tmp_path / "bare.duckdb"), read_only=True) as con:
        data = load(con)
        assert data.diagnosis == [] and data.frontier_rows == [] and data.is_probe == frozenset()
        assert sections.at_a_glance(data) == sections.what_filled_first(data) == [NO_DIAGNOSIS]
        assert sections.capacity_search(data) == []  # not even its heading
        assert not any(b.startswith("<details>") for b in sections.runs(data))


def test_the_report_shows_every_section():
    """report.qmd is layout only: each section function is displayed once, in a loop."""
    qmd = QMD.read_text()
    shown = re.findall(r"^for block in sections\.(\w+)\((?:data)?\):\n    display\(HTML\(block\)\)$", qmd, re.M)
    public = ["page_head", "at_a_glance", "runs", "what_filled_first", "part_by_part", "capacity_search", "setup",
              "side_by_side", "measurement_checks", "request_checks", "each_run"]
    assert shown == public
    assert all(callable(getattr(sections, name)) for name in public)
