"""The report's sections (filledfirst.report.sections) on a real DuckDB: the report's
runs of helpers/report_runs.py (ok, cut short, failed) and one capacity-search probe,
ingested and diagnosed (its search's table `frontiers` not made: that is
test_report_frontiers')."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import duckdb
import pytest

from filledfirst.report import markup, render, sections
from filledfirst.report.data import load
from filledfirst.store.ingest import ingest

from helpers.report_runs import (
    FAILED_RUN_ERROR,
    HOST,
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
    meta = run_meta(PROBE, PROBE_EXPERIMENT, "ok", 8, started=4, part="frontier")  # as the runner writes it
    meta["frontier"] = {"name": "cap", "setting": "default", "probe": 1, "rate": 2.0, "probe_s": 1.0, "requests": 2,
                        "attainment": 0.5, "held": False, "missed": {"failed": 0, "ttft": 1, "itl": 0}}
    meta["versions"] = {**meta["versions"], "vllm": "0.33.0"}
    return write_run(root / meta["run_id"], meta, [r for r, _ in built], [t for _, toks in built for t in toks],
                     samples)


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return report_db(root / "study.duckdb", [*report_runs(root), probe_run(root)])


@pytest.fixture(scope="module")
def data(db):
    con = duckdb.connect(str(db), read_only=True)
    yield load(con)
    con.close()


@pytest.fixture(scope="module")
def published(db):
    con = duckdb.connect(str(db), read_only=True)
    yield load(con, publish=True)
    con.close()


RENDERED = datetime(2026, 12, 6, 18, 30, tzinfo=UTC)


def test_the_head_dates_the_study_and_says_what_it_ran_on(data):
    head = "".join(sections.study_head(data, RENDERED))
    # the runs started at 01:00 to 04:00 (helpers.report_runs; the probe last), each 3 s long
    assert "Measured 2025-01-01 01:00 to 04:00 UTC (3 runs, 1 capacity-search probes)." in head
    assert "This page was made 2026-12-06 18:30 UTC." in head
    rows = dict(re.findall(r"<th scope='row'>([^<]+)</th><td>([^<]*)</td>", head))
    assert rows["model"] == "tiny-qwen2 float32"
    assert rows["engine"] == "differs between runs (Setup)"  # the probe ran on a newer vLLM
    assert rows["devices"] == "AMD EPYC, 2 cores, 24 GiB" and rows["host"] == HOST
    assert rows["versions"] == "Python 3.11"


def test_a_published_report_leaves_out_host_names_and_command_lines(data, published):
    every = [name for name in (*NOT_CAPACITY_SEARCH, "capacity_search")]
    whole = "".join("".join(getattr(sections, name)(data)) for name in every)
    assert HOST in whole and "server command" in whole  # the private report has both
    shown = "".join("".join(getattr(sections, name)(published)) for name in every)
    head = "".join(sections.study_head(published, RENDERED))
    assert HOST not in shown + head and "server command" not in shown and "vllm.entrypoints" not in shown
    assert "host names and server command lines left out" in head and "tiny-qwen2" in head
    # the rest is the same page: the runs, their labels and their settings
    assert all(run in shown for run in (RUN_A, RUN_LEGACY, RUN_FAILED)) and "max_num_seqs" in shown


def test_load_tells_the_probes_from_the_experiments(data):
    assert data.is_probe == {PROBE}
    assert [r.run_id for r in data.experiments] == [RUN_A, RUN_LEGACY, RUN_FAILED]  # by start time
    assert [r.run_id for r in data.probes] == [PROBE]
    assert [r.run_id for r in data.measured] == [RUN_A, RUN_LEGACY]  # the failed run measured nothing
    assert {d.run_id for d in data.diagnosis} == {RUN_A, RUN_LEGACY, RUN_FAILED, PROBE}
    assert data.part_of[RUN_A] == "interference" and list(data.study_parts)
    assert PROBE not in data.part_of  # its run.json says part `frontier`: a probe is in no part of the study
    assert [(p.run_id, p.probe.requests, p.probe.missed) for p in data.probe_points] == [
        (PROBE, 2, {"failed": 0, "ttft": 1, "itl": 0})]  # read without table `frontiers`


# Every section but the capacity searches' own, by name (the page's head holds no data).
NOT_CAPACITY_SEARCH = ["at_a_glance", "runs", "what_filled_first", "part_by_part", "setup", "side_by_side",
                       "measurement_checks", "request_checks", "each_run"]


def test_no_section_but_the_capacity_search_shows_a_probe(data):
    for name in NOT_CAPACITY_SEARCH:
        html = "".join(getattr(sections, name)(data))
        assert PROBE not in html and PROBE_EXPERIMENT not in html, name
    shown = "".join(sections.capacity_search(data))
    assert PROBE in shown and PROBE_EXPERIMENT in shown


def test_runs_lists_the_studys_runs_and_says_why_a_run_is_not_ok(data):
    blocks = sections.runs(data)
    assert blocks[0] == markup.para("3 runs: 1 complete, 1 cut short, 1 failed.")  # the probe is no run of the study
    assert all(run in blocks[1] for run in (RUN_A, RUN_LEGACY, RUN_FAILED))
    assert blocks[2] == markup.para(sections.probes_sentence(1)) and "Capacity search" in blocks[2]
    assert blocks[3:] == [markup.para(f"{RUN_LEGACY} was cut short: server exited with code -9"),
                          markup.para(f"{RUN_FAILED} failed: {FAILED_RUN_ERROR}")]
    assert not any(b.startswith("<details>") for b in blocks)
    assert "<script>" not in "".join(blocks)  # the error is text


def test_what_filled_first_lists_the_designed_runs(data):
    blocks = sections.what_filled_first(data)
    assert "interference" in blocks[0] and "kv-pressure" in blocks[0]
    assert not any(b.startswith("<details>") for b in blocks)


def test_the_parts_hold_the_studys_runs_only(data):
    html = "".join(sections.part_by_part(data))
    assert "How does a long prefill affect other requests?" in html and "decode-legacy" in html
    assert markup.heading("frontier") not in html  # the probe's run.json part is no part of the study


def test_capacity_search_folds_each_searchs_probes_until_diagnosed(data):
    assert sections.capacity_search_heading(data) == ["## Capacity search"]
    blocks = sections.capacity_search(data)
    assert markup.heading("Frontier cap") in blocks
    assert NO_DIAGNOSIS in blocks  # no table `frontiers` yet: the probes all the same
    (folded,) = [b for b in blocks if b.startswith("<details>")]
    assert folded.startswith("<details><summary>default: its 1 probe</summary>")
    table = folded[:folded.index("</table>")]
    assert table.count("<tr>") == 2  # the header and the one probe
    row = table[table.rindex("<tr>"):]
    label = next(d.label for d in data.diagnosis if d.run_id == PROBE)  # its run's own diagnosis
    assert re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row) == [
        "1", "2 req/s", "1.0 s", "2", "50.0 %", "—", "—", "broke", "—", label, "0", "1", "0", PROBE]
    assert "vllm.entrypoints.openai.api_server" in folded  # its search's server command


def test_setup_shows_shared_keys_once_and_what_differs_per_run(data):
    by_run, common, differing = sections.shared_setup(data.documents)
    assert common["model.name"] == "tiny-qwen2" and common["hardware.cores"] == 2
    assert differing == ["versions.vllm"] and "versions.vllm" not in common
    assert by_run[PROBE]["versions.vllm"] == "0.33.0"
    blocks = sections.setup(data)
    shared, differs = blocks[0], blocks[1]
    assert "shared by every run" in shared and shared.count("model.name") == 1 and "0.32.0" not in shared
    assert differs.startswith("<details><summary>what differs between runs")
    assert "0.32.0" in differs and "0.33.0" not in differs  # the study's runs as columns, no probe
    assert "server settings, per run (2 keys)" in "".join(blocks)
    commands = [b for b in blocks if "server command" in b]
    assert len(commands) == 3  # a probe's is under Capacity search


def test_each_run_has_a_section_per_experiment_and_none_per_probe(data):
    blocks = sections.each_run(data)
    assert [b for b in blocks if b.startswith("<h3>")] == [
        markup.heading(f"{RUN_A} (interference)"), markup.heading(f"{RUN_LEGACY} (decode-legacy)"),
        markup.heading(f"{RUN_FAILED} (kv-pressure)")]
    assert markup.para(f"Nothing was measured. Status failed: {FAILED_RUN_ERROR}") in blocks
    # RUN_A: its TTFT parts and its signals; the legacy run (no server timings): its signals
    assert sum('class="ff-chart"' in b for b in blocks) == 3


def test_side_by_side_and_the_checks_show_the_studys_runs(data):
    (compare,) = sections.side_by_side(data)
    assert RUN_A in compare and RUN_LEGACY in compare
    (table,) = sections.measurement_checks(data)
    assert RUN_A in table and RUN_LEGACY in table
    (per_request,) = sections.request_checks(data)
    assert RUN_A in per_request


def test_a_database_not_yet_diagnosed_says_how_to_diagnose_it(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    ingest(report_runs(root), tmp_path / "bare.duckdb")
    with duckdb.connect(str(tmp_path / "bare.duckdb"), read_only=True) as con:
        data = load(con)
        assert data.diagnosis == [] and data.frontier_rows == [] and data.is_probe == frozenset()
        assert sections.at_a_glance(data) == sections.what_filled_first(data) == [NO_DIAGNOSIS]
        assert sections.capacity_search_heading(data) == sections.capacity_search(data) == []  # not even a heading
        assert not any(b.startswith("<details>") for b in sections.runs(data))


def test_the_report_shows_every_section():
    """report.qmd is layout only: each section function is displayed once, in a loop."""
    qmd = QMD.read_text()
    shown = re.findall(r"^for block in sections\.(\w+)\((?:data|COMPARE)?\):\n    display\(HTML\(block\)\)$",
                       qmd, re.M)
    public = ["page_head", "compare_link", "at_a_glance", "runs", "what_filled_first", "part_by_part",
              "capacity_search", "setup", "side_by_side", "measurement_checks", "request_checks", "step_times",
              "each_run"]
    assert shown == public
    assert all(callable(getattr(sections, name)) for name in public)
    # its heading as Markdown, right before it: the table of contents lists it
    assert ("for heading in sections.capacity_search_heading(data):\n    display(Markdown(heading))\n"
            "for block in sections.capacity_search(data):") in qmd


def test_the_report_has_a_table_of_contents_of_its_sections():
    front, _ = render.parse_qmd(QMD.read_text())
    html = front["format"]["html"]
    assert html["toc"] is True and html["toc-depth"] == 2  # the sections, not every run's
    assert html["embed-resources"] is True
