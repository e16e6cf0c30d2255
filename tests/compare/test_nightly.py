"""The nightly job (filledfirst.nightly) with a stand-in for the study's measurement: each
night writes a results database (helpers/compare_dbs.py) and a report into its own dated
folder. What the design guarantees: every night a fresh folder, the baseline set by the
first night and moved only by a night that passed, a failed study or gate leaving it,
both pages published, old nights removed but never the baseline. The real study through
Snakemake, twice, is tests/workflow/test_compare_e2e.py."""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta, timezone

import pytest
import yaml

from filledfirst import nightly
from filledfirst.cli import main
from filledfirst.paths import RESULTS_DB

from conftest import REPO
from helpers.compare_dbs import results_db, study_run

START = datetime(2026, 12, 1, 2, 0, tzinfo=timezone.utc)
KNEE = ("decode", "seq8", 4.0, 4.4, 3.8, "converged", "active-sequence limit", False)
DROPPED = ("decode", "seq8", 2.0, 2.2, 1.9, "converged", "active-sequence limit", False)


@pytest.fixture(scope="module")
def databases(tmp_path_factory):
    d = tmp_path_factory.mktemp("dbs")
    return {"steady": results_db(d / "steady.duckdb", [study_run("ref")], [KNEE]),
            "dropped": results_db(d / "dropped.duckdb", [study_run("ref")], [DROPPED])}


@pytest.fixture
def config():
    return REPO / "tests" / "configs" / "e2e.yaml"  # a valid study: the stand measures none of it


class Stand:
    """The measurement: copies the database `outcome` names into the night, or fails."""

    def __init__(self, databases):
        self.databases, self.outcome, self.seen = databases, "steady", []

    def __call__(self, night: nightly.Night, configs):
        self.seen.append((night.folder, configs))
        if self.outcome == "fails":
            return 1
        night.results.mkdir()
        night.reports.mkdir()
        shutil.copyfile(self.databases[self.outcome], night.results / RESULTS_DB)
        (night.reports / "report.html").write_text(f"<p>{night.folder.name}</p>")
        return 0


def test_each_night_measures_afresh_and_the_baseline_moves_only_on_a_pass(tmp_path, databases, config, capsys):
    root, site, stand = tmp_path / "nightly", tmp_path / "site", Stand(databases)

    def night(k, outcome):
        stand.outcome = outcome
        return nightly.run([config], root, stand, data=tmp_path / "data", publish=site,
                           now=START + timedelta(days=k))

    (tmp_path / "data").mkdir()
    # the first night: no baseline, none compared, it becomes the baseline
    assert night(0, "steady") == nightly.PASSED
    first = root / "nights" / "2026-12-01T020000Z"
    assert (root / "last-good").resolve() == first and (first / "data").resolve() == tmp_path / "data"
    assert stand.seen[-1][1] == [config]  # no overlay without a baseline
    assert not (first / "reports" / "compare.html").exists()
    # the second: its own folder, the workflow told the baseline, compared, passes, moves it
    assert night(1, "steady") == nightly.PASSED
    second = root / "nights" / "2026-12-02T020000Z"
    overlay = yaml.safe_load((second / "nightly.yaml").read_text())
    assert overlay == {"compare": {"baseline": str(first / "results")}}
    assert stand.seen[-1][1][-1] == second / "nightly.yaml"
    assert (second / "reports" / "compare.html").is_file() and (second / "results" / "compare.duckdb").is_file()
    assert (root / "last-good").resolve() == second
    assert (site / "report.html").read_text() == "<p>2026-12-02T020000Z</p>" and (site / "compare.html").is_file()
    # a knee halved: the gate fails, the baseline stays, the pages say why
    assert night(2, "dropped") == nightly.GATE_FAILED
    assert "gate: knee decode/seq8: 4 -> 2 req/s" in capsys.readouterr().err
    assert (root / "last-good").resolve() == second
    assert "2026-12-03T020000Z" in (site / "report.html").read_text()
    # a study that fails: the night stays for its logs, nothing published, the baseline stays
    assert night(3, "fails") == nightly.STUDY_FAILED
    assert (root / "nights" / "2026-12-04T020000Z").is_dir() and (root / "last-good").resolve() == second
    assert "2026-12-03T020000Z" in (site / "report.html").read_text()
    # compared with the last good night again, not with the one that failed the gate
    assert night(4, "steady") == nightly.PASSED
    assert yaml.safe_load((root / "nights" / "2026-12-05T020000Z" / "nightly.yaml").read_text()) == {
        "compare": {"baseline": str(second / "results")}}


def test_old_nights_go_but_never_the_baseline(tmp_path, databases, config):
    root, stand = tmp_path / "nightly", Stand(databases)
    assert nightly.run([config], root, stand, now=START) == nightly.PASSED
    stand.outcome = "dropped"
    for k in range(1, 4):
        assert nightly.run([config], root, stand, keep=2, now=START + timedelta(days=k)) == nightly.GATE_FAILED
    left = sorted(p.name for p in (root / "nights").iterdir())
    assert left == ["2026-12-01T020000Z", "2026-12-03T020000Z", "2026-12-04T020000Z"]


def test_two_nights_in_one_second_get_two_folders(tmp_path, databases, config):
    root, stand = tmp_path / "nightly", Stand(databases)
    for _ in range(2):
        assert nightly.run([config], root, stand, now=START) == nightly.PASSED
    assert sorted(p.name for p in (root / "nights").iterdir()) == ["2026-12-01T020000Z", "2026-12-01T020000Z-1"]


def test_a_baseline_without_results_is_a_clear_error(tmp_path, config, capsys):
    root = tmp_path / "nightly"
    (root / "nights" / "x").mkdir(parents=True)
    (root / "last-good").symlink_to(root / "nights" / "x")
    assert main(["nightly", "--config", str(config), "--root", str(root)]) == 2
    assert "has no results database" in capsys.readouterr().err


def test_the_command_needs_the_workflow(tmp_path, config, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["nightly", "--config", str(config), "--root", str(tmp_path / "n")]) == 2
    assert "workflow/Snakefile: no such workflow" in capsys.readouterr().err
