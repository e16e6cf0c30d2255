"""A capacity search on the real vLLM CPU engine, through Snakemake to the DuckDB file:
two settings of tests/configs/frontier.yaml (the default cap and max_num_seqs 2), a
capacity estimate, then at most 4 probes of at least 5 s each, one server start per
setting; then seq2's two interventions (its cap doubled, its KV budget doubled), each
from seq2's knee moved by the shift predicted for it, then side by side with seq2 (the
paired check), and the verdict.
Asserts what holds at any CPU speed: files, statuses,
one start per search, the probes' rates being the search's, the tables, the verdict
being the one the knees give, the report's table, an interrupted intervention
resumed from its probes, a second frontier's search of the same server run on
knee/default's start, an experiment placed on a knee run on that search's server
(and run again alone when its folder is lost), and the interventions judged side by side
alone (interventions.search false) in seq2's job, the parent paused while the
intervention's blocks run (engine.pause_between_blocks), from blocks read back when lost.
Where the bracket lands depends on the machine, so it is only checked for consistency."""

import json
import os
import shutil
import subprocess
import sys
from html import unescape
from pathlib import Path

import duckdb
import polars as pl
import pytest
import yaml

from filledfirst.analysis.frontiers import IMPLICATED, confirmation, moved
from filledfirst.contracts.frontiers import FrontierRow
from filledfirst.contracts.search import SearchBounds, SearchRecord, StopReason
from filledfirst.frontier import paired
from filledfirst.frontier.interventions import Span, widened
from filledfirst.frontier.search import CapacitySearch, ProbeOutcome

from conftest import REPO, snakemake_argv

pytestmark = pytest.mark.engine


def search_config(tmp_path):
    cfg = yaml.safe_load((REPO / "tests" / "configs" / "e2e.yaml").read_text())
    overlay = yaml.safe_load((REPO / "tests" / "configs" / "frontier.yaml").read_text())
    cfg["workloads"] = overlay["workloads"]
    cfg["frontiers"] = overlay["frontiers"]
    # A second frontier whose one setting probes knee/default's server: the two searches
    # share that job and its start (filledfirst.config.search_groups).
    cfg["frontiers"]["twin"] = {**{k: v for k, v in overlay["frontiers"]["knee"].items() if k != "interventions"},
                                "description": "the same shape and server as knee/default",
                                "settings": {"same": {}}, "budget": 2}
    # Placed on knee/default's knee with its server: that search's job runs it after its
    # probes, on its server (filledfirst.config.hosted_experiments).
    cfg["workloads"]["half_knee"] = {"kind": "synthetic", "phases": [
        {"role": "decode", "count": 10, "rate": {"of": "knee/default", "times": 0.5},
         "prompt_tokens": 100, "output_tokens": 32}]}
    cfg["experiments"] = {"half_knee": {"workload": "half_knee", "expect": "reference"}}
    path = tmp_path / "frontier-e2e.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_capacity_search_on_the_engine(tmp_path):
    cfg = search_config(tmp_path)
    # No trace: nothing here needs the mirror that pipeline_env insists on.
    pipeline_env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    targets = ["all"]  # the user's path: searches, the study's experiment, ingest, report
    proc = subprocess.run(snakemake_argv(tmp_path, cfg, *targets), env=pipeline_env,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-6000:]
    f = yaml.safe_load(cfg.read_text())["frontiers"]["knee"]
    bounds = SearchBounds(start=f["start"], maximum=f["maximum"], budget=f["budget"],
                          estimate_step=f.get("estimate_step", 1.25))
    base = tmp_path / "results" / "frontiers" / "knee"
    for setting, cap in (("default", 64), ("seq2", 2)):
        doc = json.loads((base / setting / "search.json").read_text())
        probes = doc["probes"]
        assert 1 <= len(probes) <= 4
        # The probes are the ones the search asked for, and its result is the search's.
        search = CapacitySearch(bounds, [ProbeOutcome(p["rate"], p["attainment"], requests=p["requests"],
                                                      growth=p["backlog_growth"]) for p in probes],
                                first=doc["estimate_rps"])
        result = search.result()
        assert result is not None and doc["result"]["reason"] == str(result.reason) != StopReason.PROBE_FAILED
        assert (doc["result"]["lo"], doc["result"]["hi"]) == (result.lo, result.hi)
        # The capacity estimate (a closed loop at the cap) came first and started the server; the
        # same closed loop after the search gives the drift.
        estimate, check = doc["estimate"], doc["check"]
        assert estimate["concurrency"] == check["concurrency"] == cap
        assert estimate["throughput_rps"] > 0 and check["throughput_rps"] > 0
        assert probes[0]["rate"] == doc["estimate_rps"] == min(max(estimate["throughput_rps"], f["start"]),
                                                                f["maximum"])
        assert doc["drift"]["change"] == check["throughput_rps"] / estimate["throughput_rps"] - 1
        for tag in ("estimate", "check"):
            meta = json.loads((base / setting / tag / "run.json").read_text())
            assert meta["status"] == "ok" and meta["spec"]["loadgen"]["mode"] == "closed"
            # two rounds of the cap, and at least 100 counted after the first (FrontierPlan.reference_requests)
            assert meta["request_status_counts"] == {"ok": max(2 * cap, cap + 100)}
        assert ("startup_s" in json.loads((base / setting / "estimate" / "run.json").read_text())["timings"])
        for i, p in enumerate(probes, start=1):
            meta = json.loads((base / setting / p["run_dir"] / "run.json").read_text())
            assert meta["status"] == "ok" and meta["experiment"] == f"knee/{setting}/p{i:02d}"
            assert meta["frontier"]["attainment"] == p["attainment"]
            assert meta["server"]["settings"]["max_num_seqs"] == cap
            # one server start for the whole search: the estimate paid it, every probe reused it
            assert "startup_s" not in meta["timings"]
            assert meta["server"]["started_by"] == f"knee/{setting}/estimate"
            assert p["verdict"] in ("held", "broke", "inconclusive") and p["met"] <= p["requests"]
            assert meta["request_status_counts"].get("not_sent", 0) == 0
    assert not list(base.glob("*/.server-*"))  # the scratch log is gone

    # twin/same ran on knee/default's start, right after its search, in the same job.
    twin = tmp_path / "results" / "frontiers" / "twin" / "same"
    twin_doc = json.loads((twin / "search.json").read_text())
    assert 1 <= len(twin_doc["probes"]) <= 2 and twin_doc["result"]["reason"] != StopReason.PROBE_FAILED
    for run_dir in ("estimate", *(p["run_dir"] for p in twin_doc["probes"]), "check"):
        meta = json.loads((twin / run_dir / "run.json").read_text())
        assert meta["status"] == "ok" and meta["server"]["started_by"] == "knee/default/estimate"
        assert "startup_s" not in meta["timings"]
    assert "frontier_twin_same" not in proc.stdout + proc.stderr
    assert not list(twin.glob(".server-*"))

    # The interventions: each from seq2's knee, on its own server start, with its limit doubled.
    seq2 = json.loads((base / "seq2" / "search.json").read_text())
    for setting, knob, before, after, flag in (("seq2_seqs_x2", "max_num_seqs", 2, 4, ("max_num_seqs", 4)),
                                               ("seq2_kv_x2", "KV tokens", 32768, 65536, ("kv_tokens", 65536))):
        doc = json.loads((base / setting / "search.json").read_text())
        assert doc["intervention"] == {"parent": "seq2", "knob": knob, "before": before, "after": after,
                                       "changes": dict([flag]), "min_shift": 0.3, "paired": True,
                                       "search": True}
        knee = seq2["result"]["lo"]  # None: seq2 broke at start, and the intervention grows from it
        assert doc["estimate"] is None and doc["check"] is None
        # its start predicted before it ran, from the searches that are not interventions
        # (the engine's step time fitted on their scrapes): seq2's knee moved by the shift
        # (on this tiny engine a step is mostly fixed cost, so the fit may separate nothing:
        # then it starts at seq2's knee and says why)
        predicted = json.loads((base / setting / "prediction.json").read_text())
        assert (predicted["parent"], predicted["parent_fingerprint"], predicted["parent_knee_rps"]) == (
            "seq2", seq2["fingerprint"], knee)
        assert predicted["searches"] == ["knee/default", "knee/seq2", "twin/same"]  # not the interventions
        used = knee is not None and predicted["shift"] is not None
        if used and knob == "KV tokens":  # 4 requests of 132 tokens never fill 32,768 KV tokens: nothing to move
            assert predicted["shift"] == pytest.approx(0.0, abs=1e-6)
        start = knee * (1 + predicted["shift"]) if used else knee
        assert doc["start_rps"] == (None if knee is None else min(max(start, f["start"]), f["maximum"]))
        assert doc["predicted_start"] == (predicted if used else None)
        assert 1 <= len(doc["probes"]) <= 4 and doc["probes"][0]["rate"] == (doc["start_rps"] or f["start"])
        first = json.loads((base / setting / "p01" / "run.json").read_text())
        assert first["server"]["settings"][flag[0]] == flag[1] and "startup_s" in first["timings"]
        # judged against seq2's knee: it may stop once its move from that knee, by the least
        # shift seq2's drift widens, is decided
        against = Span.of(seq2["result"]["lo"], seq2["result"]["hi"], seq2["result"]["floor"])
        least = widened(0.3, (seq2["drift"] or {}).get("change"))
        search = CapacitySearch(bounds, [ProbeOutcome(p["rate"], p["attainment"], requests=p["requests"],
                                                      growth=p["backlog_growth"]) for p in doc["probes"]],
                                first=doc["start_rps"], against=against, min_shift=least)
        assert (doc["result"]["lo"], doc["result"]["hi"]) == (search.result().lo, search.result().hi)
        assert doc["result"]["reason"] == str(search.result().reason)
        # side by side with seq2: blocks relaxed, seq2, seq2, relaxed, closed loops of the
        # larger cap, one server at a time (seq2's started for block 2, this one again for 4)
        check = doc["paired"]
        assert check["concurrency"] == (4 if knob == "max_num_seqs" else 2)
        assert [b["side"] for b in check["blocks"]] == ["relaxed", "parent", "parent", "relaxed"]
        for i, b in enumerate(check["blocks"], 1):
            block = json.loads((base / setting / f"paired{i}-{b['side']}" / "run.json").read_text())
            assert b["loop"]["status"] == block["status"] == "ok" and b["loop"]["throughput_rps"] > 0
            assert block["server"]["settings"][flag[0]] == (flag[1] if b["side"] == "relaxed" else
                                                            {"max_num_seqs": 2, "kv_tokens": 32768}[flag[0]])
            assert ("startup_s" in block["timings"]) == (i in (2, 4))
            assert b["queue_share"] is not None
        # a cap of 2 never runs 3; 4 requests of 132 tokens never hold 32,768 KV tokens
        assert all(b["beyond_share"] == 0 for b in check["blocks"]
                   if b["side"] == "parent" or knob == "KV tokens")
        if knob == "max_num_seqs":
            assert all(b["beyond_share"] > 0 for b in check["blocks"] if b["side"] == "relaxed")
            assert all(b["queue_share"] > 0 for b in check["blocks"] if b["side"] == "parent")

    con = duckdb.connect(str(tmp_path / "results" / "filledfirst.duckdb"), read_only=True)
    settings = ("default", "seq2", "seq2_seqs_x2", "seq2_kv_x2")
    n_probes = sum(len(json.loads((base / s / "search.json").read_text())["probes"]) for s in settings)
    assert con.execute("SELECT count(*) FROM runs WHERE experiment LIKE 'knee/%'").fetchall()[0][0] == n_probes
    assert con.execute("SELECT count(*) FROM diagnosis WHERE experiment LIKE 'knee/%'").fetchall()[0][0] == n_probes
    rows = {r[0]: r[1:] for r in con.execute(
        "SELECT setting, probes, lo_rps, hi_rps, reason FROM frontiers WHERE frontier = 'knee'").fetchall()}
    assert set(rows) == set(settings)
    for setting, (n, lo, hi, reason) in rows.items():
        doc = json.loads((base / setting / "search.json").read_text())
        assert (n, lo, hi, reason) == (len(doc["probes"]), doc["result"]["lo"], doc["result"]["hi"],
                                       doc["result"]["reason"])
    # max_num_seqs 2 holds at most 2 sequences at any speed
    assert all(m <= 2 for (m,) in con.execute(
        "SELECT window_running_max FROM diagnosis"
        " WHERE experiment LIKE 'knee/seq2/%' AND window_running_max IS NOT NULL"
    ).fetchall())

    # The verdict is the one the two knees give against seq2's, the roles the ones its label names.
    table = pl.from_arrow(con.sql("SELECT * FROM frontiers WHERE frontier = 'knee'").to_arrow_table())
    by = {r["setting"]: r for r in table.to_dicts()}
    typed = {s: FrontierRow.from_columns(r) for s, r in by.items()}  # as the report reads them
    implicated = IMPLICATED.get(by["seq2"]["knee_label"])
    for setting in ("seq2_seqs_x2", "seq2_kv_x2"):
        r = by[setting]
        assert r["least_shift"] == pytest.approx(widened(0.3, by["seq2"]["drift"]))
        assert r["parent"] == "seq2" and r["moved"] == moved(typed["seq2"], typed[setting], r["least_shift"])
        assert r["role"] == (None if implicated is None else "relaxed" if r["knob"] == implicated else "control")
        found = paired.verdict(paired.blocks_of(SearchRecord.read(base / setting / "search.json").paired), 0.3)
        assert (r["paired_verdict"], r["paired_shift"]) == (found.verdict.value, found.shift)
    # the KV budget was never used beyond seq2's: side by side, not a move
    assert by["seq2_kv_x2"]["paired_verdict"] == "not confirmed"
    relaxed = next((typed[s] for s, r in by.items() if r["role"] == "relaxed"), None)
    control = next((typed[s] for s, r in by.items() if r["role"] == "control"), None)
    verdict, _ = confirmation(by["seq2"]["knee_label"], relaxed, control)
    assert by["seq2"]["verdict"] == (verdict.value if verdict else None)
    assert by["default"]["verdict"] is None and by["default"]["parent"] is None
    con.close()

    # The report folds each search's probes under Capacity search, and says what moved the knee.
    html = (tmp_path / "reports" / "report.html").read_text()
    assert "<summary>default: its " in html and "<summary>seq2: its " in html
    assert "knee/default/p01" in html and "knee/seq2/p01" in html
    assert "What moved the knee" in html and "seq2_seqs_x2: max_num_seqs 2 -&gt; 4" in html
    assert "seq2_kv_x2: KV tokens 32,768 -&gt; 65,536" in html
    assert "side by side (completions per second)" in html

    # half_knee ran on knee/default's server after its search: no start of its own, its
    # schedule at half the knee the search wrote.
    hosted = json.loads((tmp_path / "results" / "runs" / "half_knee" / "run.json").read_text())
    assert hosted["status"] == "ok" and hosted["request_status_counts"] == {"ok": 10}
    assert hosted["server"]["after_search"] == "knee/default"
    assert hosted["server"]["started_by"] == "knee/default/estimate" and "startup_s" not in hosted["timings"]
    default = json.loads((base / "default" / "search.json").read_text())
    placed = hosted["schedule"]["stats"]["relative"][0]
    assert placed["of"] == "knee/default" and placed["knee_rps"] == default["result"]["lo"]
    assert placed["rate_rps"] == 0.5 * default["result"]["lo"]
    assert "run_group_half_knee" not in proc.stdout + proc.stderr

    # Done is done: a second call has nothing to do.
    again = subprocess.run(snakemake_argv(tmp_path, cfg, *targets, "-n"), env=pipeline_env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr

    # An intervention interrupted after its probes (no search.json) resumes from them: none is
    # measured again, no server starts, and the result is the same.
    kv = base / "seq2_kv_x2" / "search.json"
    written = json.loads(kv.read_text())
    kv.unlink()
    resumed = subprocess.run(snakemake_argv(tmp_path, cfg, str(kv.relative_to(tmp_path))), env=pipeline_env,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    again_doc = json.loads(kv.read_text())
    assert all(p["reused"] for p in again_doc["probes"]) and again_doc["result"] == written["result"]
    assert again_doc["paired"] == written["paired"]  # its blocks read back
    assert [p["run_id"] for p in again_doc["probes"]] == [p["run_id"] for p in written["probes"]]
    log = (tmp_path / "results" / "logs" / "frontier-knee-seq2_kv_x2.log").read_text()
    assert "reusing probe 1" in log and "probing" not in log

    # A hosted run lost: its search's job runs again, reads its probes and closed loops
    # back, and starts a server for the hosted run alone.
    run = tmp_path / "results" / "runs" / "half_knee"
    shutil.rmtree(run)
    redone = subprocess.run(snakemake_argv(tmp_path, cfg, str(run.relative_to(tmp_path))), env=pipeline_env,
                            capture_output=True, text=True, timeout=600)
    assert redone.returncode == 0, redone.stderr[-4000:]
    log = (tmp_path / "results" / "logs" / "frontier-knee-default.log").read_text()
    assert "probing" not in log and "reusing probe 1" in log  # both searches' probes
    assert json.loads((twin / "search.json").read_text())["result"] == twin_doc["result"]
    again = json.loads((run / "run.json").read_text())
    assert again["status"] == "ok" and again["server"]["started_by"] == "half_knee"
    assert "startup_s" in again["timings"]
    assert json.loads((base / "default" / "search.json").read_text())["result"] == default["result"]

    # Judged side by side alone (interventions.search false): the interventions have no job
    # of their own; seq2's job checks them right after its search (read back here: no
    # probe), blocks seq2, relaxed, relaxed, seq2 in each intervention's folder (the blocks
    # of the other order gone); their probes are gone and they have no knee; the table
    # keeps their paired verdicts, and the report says they were not searched. The side not
    # measured waits paused (engine.pause_between_blocks, no part of any run's identity: seq2's
    # probes are read back): the parent's last block runs on the start of its first.
    written = yaml.safe_load(cfg.read_text())
    written["frontiers"]["knee"]["interventions"]["search"] = False
    written["engine"]["pause_between_blocks"] = True
    cfg.write_text(yaml.safe_dump(written))
    alone = subprocess.run(snakemake_argv(tmp_path, cfg, "all"), env=pipeline_env, capture_output=True, text=True,
                           timeout=900)
    assert alone.returncode == 0, alone.stderr[-4000:]
    ran = alone.stdout + alone.stderr
    assert "rule frontier_knee_seq2:" in ran and "rule frontier_knee_seq2_seqs_x2:" not in ran
    assert "rule predict_" not in ran
    log = (tmp_path / "results" / "logs" / "frontier-knee-seq2.log").read_text()
    assert "reusing probe 1" in log and "probing" not in log
    checks = {}
    for setting in ("seq2_seqs_x2", "seq2_kv_x2"):
        doc = json.loads((base / setting / "search.json").read_text())
        assert doc["probes"] == [] and doc["result"]["reason"] == StopReason.NOT_SEARCHED
        assert doc["result"]["lo"] is None and doc["intervention"]["search"] is False
        assert not list((base / setting).glob("p[0-9]*"))
        blocks = doc["paired"]["blocks"]
        assert [b["side"] for b in blocks] == ["parent", "relaxed", "relaxed", "parent"]
        assert sorted(d.name for d in (base / setting).glob("paired*")) == [
            f"paired{i}-{b['side']}" for i, b in enumerate(blocks, 1)]
        assert all(b["loop"]["status"] == "ok" for b in blocks)
        assert "judged side by side with seq2" in log and f"knee/{setting}: paired check, block 4 of 4" in log
        first, relaxed, last = (json.loads((base / setting / f"paired{i}-{blocks[i - 1]['side']}" / "run.json"
                                            ).read_text()) for i in (1, 2, 4))
        assert "startup_s" in relaxed["timings"] and "startup_s" not in last["timings"]
        assert last["server"]["started_by"] == first["server"]["started_by"] != relaxed["server"]["started_by"]
        checks[setting] = doc["paired"]
    assert log.count("vLLM paused") == log.count("vLLM resumed") == 2  # once in each check
    con = duckdb.connect(str(tmp_path / "results" / "filledfirst.duckdb"), read_only=True)
    rows = con.execute("SELECT setting, probes, lo_rps, reason, paired_verdict FROM frontiers"
                       " WHERE parent = 'seq2' ORDER BY setting").fetchall()
    con.close()
    verdicts = {s: paired.verdict(paired.blocks_of(SearchRecord.read(base / s / "search.json").paired), 0.3)
                for s in checks}
    assert rows == [(s, 0, None, "not_searched", verdicts[s].verdict.value) for s in sorted(checks)]
    assert verdicts["seq2_kv_x2"].verdict.value == "not confirmed"  # never used beyond seq2's budget
    html = unescape((tmp_path / "reports" / "report.html").read_text())
    assert "not searched: judged side by side with seq2" in html

    # A check's search.json lost: seq2's job runs again and reads everything back, its
    # probes, its closed loops and both checks' blocks: no server starts.
    (base / "seq2_kv_x2" / "search.json").unlink()
    again = subprocess.run(snakemake_argv(tmp_path, cfg, str((base / "seq2_kv_x2" / "search.json").relative_to(
        tmp_path))), env=pipeline_env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-4000:]
    log = (tmp_path / "results" / "logs" / "frontier-knee-seq2.log").read_text()
    assert "starting vLLM" not in log and "probing" not in log
    for setting, check in checks.items():
        assert json.loads((base / setting / "search.json").read_text())["paired"] == check
