"""filledfirst compare on the real vLLM CPU engine, through Snakemake: one small study (a
capacity search of a capped setting, and one experiment at a quarter of its knee on its
server) run twice by `filledfirst nightly` (two nights: each from scratch in its own
dated folder, the second with the first as its baseline), and a variant differing only
in the cap (max_num_seqs 2 against 32). What the design guarantees at any CPU speed:
- the same study twice: two measurements (two folders, two sets of run ids), every knee
  and run figure compared says no significant change, the gate passes (the nightly exits
  0 and moves the baseline), and `all` made the comparison and linked it from the report;
- the variant: its knee is higher than the capped one's beyond both intervals and the
  drift-widened least shift, so the capped study against it is lower and fails the gate.
  The least ratio that counts can be x3 on these VMs (a search's server sped up by 67 %
  over it here): 2 sequences against 8 once came out x1.93 (7.0 and 13.5 req/s), no
  change. No cap buys more than the step's per-sequence cost allows: 16 sequences held
  25.1 to 27.7 req/s, a step of about 3.9 ms plus 0.3 ms a sequence; 32 then held 34.7,
  x5.3 the 2-sequence knee of the same run (6.52). (A base of one sequence was x7.9 from 16, but its
  run at a quarter of its knee was at the cap a quarter of the time: `reference` in one
  study, `unclassified` in the next.)
The run at a quarter of the knee is on the search's server, so its figures' least change
is widened by that search's drift: the same study twice once gave the run TTFT p90 +167 %
and ITL p50 +55 % with the two searches' servers moving by +67 % and -23 % (least
+208 %). It has 40 requests, so that a few slow ones are not its p90.
The comparison page draws every chart offline in headless Chromium. The slower and
faster test engines (tests/configs/slower.yaml, faster.yaml) were run by hand, as for
the other engine tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import yaml

from conftest import REPO, engine_overlay_files, snakemake_argv
from helpers.chromium import ChartDivs, chromium_run

pytestmark = pytest.mark.engine

FIGURES_PER_RUN = 5  # filledfirst.compare.figures.FIGURES


def study_config(folder: Path, cap: int) -> Path:
    cfg = yaml.safe_load((REPO / "tests" / "configs" / "e2e.yaml").read_text())
    cfg["workloads"] = {"light": cfg["workloads"]["light"],
                        "paced": {"kind": "synthetic", "phases": [
                            {"role": "decode", "count": 10, "interval_s": 0.5, "prompt_tokens": 100,
                             "output_tokens": 64}]}}
    # At a quarter of the knee, on the search's server: the search's job runs it (one
    # server start per study, filledfirst.config.hosted_experiments).
    phase = cfg["workloads"]["light"]["phases"][0]
    del phase["interval_s"]  # a phase's pace is an interval or a relative rate, not both
    phase.update(rate={"of": "knee/capped", "times": 0.25}, count=40)
    cfg["experiments"] = {"reference": {"workload": "light", "server": {"max_num_seqs": cap}}}
    cfg["frontiers"] = {"knee": {
        "description": "the paced shape under a sequence cap", "workload": "paced",
        "settings": {"capped": {"max_num_seqs": cap}}, "slo": {"ttft_ms": 1000, "itl_ms": 500},
        "start": 1, "maximum": 512, "probe_s": 5, "budget": 6, "estimate_batches": 2}}
    # two studies minutes apart on these VMs can differ by 10 % beyond their intervals and
    # their searches' drift: the gate of the same study twice allows 30 %
    cfg["compare"] = {"fail_on": {"knee_drop": 0.3}}
    folder.mkdir(parents=True)
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    made = {}
    # the same study on two nights, then the variant's database alone
    cfg = study_config(root / "study", 2)
    overlays = [arg for o in engine_overlay_files() for arg in ("--config", str(o))]
    for name in ("first", "again"):
        proc = subprocess.run([sys.executable, "-m", "filledfirst", "nightly", "--root", str(root / "nightly"),
                               "--snakefile", str(REPO / "workflow" / "Snakefile"), "--config", str(cfg), *overlays],
                              env=env, capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, proc.stderr[-6000:]
        made[name] = (root / "nightly" / "last-good").resolve()  # each night passed: the baseline now
    wide = root / "wide"
    proc = subprocess.run(snakemake_argv(wide, study_config(wide, 32), "results/filledfirst.duckdb"), env=env,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-6000:]
    made["wide"] = wide
    return made


def compare(base: Path, cand: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "filledfirst", "compare", str(base), str(cand), "--out", str(out),
                           "--db", str(out.with_suffix(".duckdb")), *flags], capture_output=True, text=True,
                          timeout=300)


def tables(db: Path) -> dict[str, list[dict]]:
    with duckdb.connect(str(db), read_only=True) as con:
        return {t: con.sql(f"SELECT * FROM {t}").pl().to_dicts()
                for t in ("compare_knees", "compare_runs", "compare_labels", "compare_setup", "compare_one_side")}


def test_the_same_study_twice_changes_nothing(studies):
    first, again = studies["first"], studies["again"]
    assert first != again and first.parent == again.parent  # two nights, two folders
    ids = []
    for night in (first, again):
        with duckdb.connect(str(night / "results" / "filledfirst.duckdb"), read_only=True) as con:
            ids.append({r for (r,) in con.execute("SELECT run_id FROM runs").fetchall()})
    assert ids[0] and not ids[0] & ids[1]  # measured twice
    # `all` with a baseline made the comparison and linked it from the report
    assert 'href="compare.html"' in (again / "reports" / "report.html").read_text()
    t = tables(again / "results" / "compare.duckdb")
    assert len(t["compare_knees"]) == 1 and len(t["compare_runs"]) == FIGURES_PER_RUN
    verdicts = [r["verdict"] for r in t["compare_knees"] + t["compare_runs"]]
    assert verdicts == ["no significant change"] * (1 + FIGURES_PER_RUN), (t["compare_knees"], t["compare_runs"])
    assert [r["label_changed"] for r in t["compare_labels"]] == [False]
    assert t["compare_one_side"] == []
    meta = json.loads((again / "results" / "runs" / "reference" / "run.json").read_text())
    assert meta["server"]["after_search"] == "knee/capped"  # one start per study
    assert not any(r["key"].endswith("server.max_num_seqs") for r in t["compare_setup"])


def test_a_smaller_cap_lowers_the_knee_and_fails_the_gate(studies, tmp_path):
    out = tmp_path / "capped.html"
    run = compare(studies["wide"] / "results", studies["first"] / "results", out)
    assert run.returncode == 1, run.stderr[-3000:]
    assert "gate: knee knee/capped:" in run.stderr
    t = tables(out.with_suffix(".duckdb"))
    (knee,) = t["compare_knees"]
    assert knee["verdict"] == "lower" and knee["shift"] < -0.3, knee
    assert knee["cand_hi_rps"] <= knee["base_floor_rps"]  # beyond both intervals
    assert {"key": "knee/capped: server.max_num_seqs", "base": "32", "candidate": "2"} in t["compare_setup"]
    # the other way round it is higher, and a higher knee fails nothing
    up = compare(studies["first"] / "results", studies["wide"] / "results", tmp_path / "up.html")
    assert tables(tmp_path / "up.duckdb")["compare_knees"][0]["verdict"] == "higher"
    assert up.returncode == 0 or "what filled first changed" in up.stderr, up.stderr[-3000:]


@pytest.mark.browser
@pytest.mark.usefixtures("chromium")
def test_the_comparison_draws_offline(studies, tmp_path):
    page = studies["again"] / "reports" / "compare.html"
    run = chromium_run("--dump-dom", page.as_uri(), profile=tmp_path / "profile")
    parser = ChartDivs()
    parser.feed(run.stdout)
    assert len(parser.charts) == 2 and all(parser.charts.values()), parser.charts
    assert [line for line in run.stderr.splitlines() if ":CONSOLE" in line] == []
