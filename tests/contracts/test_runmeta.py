"""run.json, typed (filledfirst.contracts.runmeta): decoded once at ingest, its key facts lifted into
columns of table `runs`, nothing downstream walking the document by string paths."""

import json

import duckdb
import pytest

from filledfirst import atomic
from filledfirst.analysis import signals
from filledfirst.contracts import runmeta
from filledfirst.run import folder
from filledfirst.store.ingest import ingest

from helpers.run_folder import make_run, write_run

PROBE = {"name": "decode", "setting": "seq8", "probe": 3, "rate": 4.0, "probe_s": 10.0,
         "slo": {"ttft_ms": 2000.0, "itl_ms": 1000.0}, "target": 0.95, "fingerprint": "ab", "requests": 40,
         "attainment": 0.9, "held": False, "missed": {"failed": 0, "ttft": 4, "itl": 0}, "error": None}


def document(**extra) -> dict:
    return {
        "run_id": "seq_limit-1", "experiment": "seq_limit", "status": "ok", "workload": "natural12",
        "part": "sequence_limit", "expect": "active-sequence limit",
        "model": {"name": "tiny", "path": "data/models/tiny", "dtype": "float32", "prompt_token_ids": {"low": 1}},
        "server": {"launcher": "cpu", "settings": {"max_num_seqs": 8}, "argv": ["vllm", "--max-num-seqs", "8"],
                   "shared_with": ["seq_limit"]},
        "spec": {"loadgen": {"mode": "closed", "concurrency": 16, "seed": 0}, "scrape": {"interval_s": 0.5}},
        "schedule": {"path": "s.parquet", "requests": 128, "stats": {"duration_s": 0, "requests": 128}},
        "versions": {"vllm": "0.32.0"}, "a_key_of_a_newer_runner": [1, 2],
        **extra,
    }


def test_a_run_json_decodes_whole_with_unknown_keys_and_null_sections():
    m = runmeta.decode(document())
    assert (m.part, m.expect, m.max_num_seqs, m.closed_loop, m.load_mode) == (
        "sequence_limit", "active-sequence limit", 8, True, "closed")
    assert m.concurrency == 16 and m.scrape_interval_s == 0.5 and m.model.dtype == "float32"
    # sections written as null read as absent; the cap falls back to the spec's
    old = runmeta.decode({"run_id": "r", "experiment": "e", "status": "ok", "schedule": None, "model": None,
                          "spec": {"server": {"max_num_seqs": 4}}})
    assert old.max_num_seqs == 4 and old.schedule.stats is None and old.frontier is None
    # an external replay records no mode: a schedule all at one instant is a closed loop
    ext = runmeta.decode({"run_id": "r", "experiment": "e", "status": "ok",
                          "schedule": {"stats": {"duration_s": 0, "requests": 5}}})
    assert ext.closed_loop and not runmeta.decode({"run_id": "r", "experiment": "e", "status": "ok"}).closed_loop
    with pytest.raises(ValueError, match="run.json"):
        runmeta.decode(document(frontier={"name": "decode"}))  # a probe block without its probe


def test_ingest_lifts_run_json_into_columns_and_refuses_a_bad_one(tmp_path):
    run = make_run(tmp_path / "lim", "seq_limit-1")
    atomic.write_json(document(), run / folder.RUN_JSON)
    probe = make_run(tmp_path / "p03", "probe-1")
    atomic.write_json({"run_id": "probe-1", "experiment": "decode/seq8/p03", "status": "ok",
                       "spec": {"loadgen": {"mode": "open"}}, "frontier": PROBE}, probe / folder.RUN_JSON)
    db = tmp_path / "f.duckdb"
    ingest([run, probe], db)
    con = duckdb.connect(str(db), read_only=True)
    cols = "part, expect, load_mode, concurrency, frontier, frontier_setting, frontier_probe, frontier_rate_rps"
    rows = {r[0]: r[1:] for r in con.execute(f"SELECT run_id, {cols} FROM runs").fetchall()}
    assert rows["seq_limit-1"] == ("sequence_limit", "active-sequence limit", "closed", 16, None, None, None, None)
    assert rows["probe-1"] == (None, None, "open", None, "decode", "seq8", 3, 4.0)
    metas = signals.run_metas(con)
    assert metas["probe-1"].frontier.attainment == 0.9 and metas["seq_limit-1"].server.argv[-1] == "8"
    con.close()
    bad = make_run(tmp_path / "bad", "bad-1")
    atomic.write_json({"run_id": "bad-1", "experiment": "bad", "status": "ok", "frontier": {"name": 1}},
                      bad / folder.RUN_JSON)
    with pytest.raises(folder.IncompleteRunDir, match="bad.*run.json"):
        ingest([bad], db)


def test_a_database_written_before_the_columns_gains_them(tmp_path):
    db = tmp_path / "old.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE runs (run_id VARCHAR PRIMARY KEY, experiment VARCHAR NOT NULL, workload VARCHAR, "
                "description VARCHAR, status VARCHAR NOT NULL, error VARCHAR, started_at VARCHAR, "
                "duration_s DOUBLE, max_num_seqs BIGINT, model VARCHAR, vllm_version VARCHAR, launcher VARCHAR, "
                "meta JSON)")
    con.execute("INSERT INTO runs (run_id, experiment, status, meta) VALUES ('old-1', 'old', 'ok', ?)",
                [json.dumps({"run_id": "old-1", "experiment": "old", "status": "ok", "part": "azure"})])
    con.close()
    run = make_run(tmp_path / "new", "new-1")
    ingest([run], db)
    con = duckdb.connect(str(db), read_only=True)
    # the runs already stored get the new columns from their run.json
    assert con.execute("SELECT run_id, part, load_mode FROM runs ORDER BY run_id").fetchall() == [
        ("new-1", None, "open"), ("old-1", "azure", "open")]
    assert signals.run_metas(con)["old-1"].part == "azure"


def test_a_stored_run_json_that_no_longer_decodes_is_known_by_its_id(tmp_path, caplog):
    db = tmp_path / "f.duckdb"
    ingest([make_run(tmp_path / "a", "a-1")], db)
    con = duckdb.connect(str(db))
    con.execute("UPDATE runs SET meta = ? WHERE run_id = 'a-1'", [json.dumps({"frontier": {"name": "x"}})])
    metas = signals.run_metas(con)
    assert metas["a-1"] == runmeta.unknown("a-1") and "a-1" in caplog.text


def lagging_run(path, run_id, *, cpu_s, replay_s, lag_per_request=0.0, closed=False, peak_s=None):
    """20 requests scheduled every 0.1 s, sent `lag_per_request` x i late, 10 tokens each."""
    from filledfirst.contracts.records import RequestRecord

    reqs = []
    for i in range(20):
        sent = 0.1 * i + lag_per_request * i
        reqs.append(RequestRecord(i, "decode", 10, 10, 0.1 * i, sent, sent + 0.02, sent + 0.02, sent + 0.2,
                                  sent + 0.2, 10, 10, 10))
    return write_run(path, {"run_id": run_id, "experiment": run_id, "status": "ok",
                            "spec": {"loadgen": {"mode": "closed" if closed else "open"}},
                            "timings": {"replay_s": replay_s, "client_cpu_s": cpu_s,
                                        **({"client_cpu_peak_s": peak_s, "client_workers": 2} if peak_s else {})}},
                     reqs)


def test_every_run_checks_its_client(tmp_path):
    """The client's CPU per 1,000 tokens and share of its core, and the arrival rate it
    achieved: a saturated or late client is a warning on the run, whatever its label."""
    from filledfirst.analysis.diagnosis import write_diagnosis
    from filledfirst.study import DiagnosisRules

    runs = [lagging_run(tmp_path / "fine", "fine", cpu_s=1.0, replay_s=4.0),
            lagging_run(tmp_path / "busy", "busy", cpu_s=3.8, replay_s=4.0),
            lagging_run(tmp_path / "late", "late", cpu_s=1.0, replay_s=4.0, lag_per_request=0.02),
            lagging_run(tmp_path / "closed", "closed", cpu_s=1.0, replay_s=4.0, closed=True),
            # two worker processes: 5.4 s of CPU in all over 4 s, the busiest 2.0 s (half its core)
            lagging_run(tmp_path / "spread", "spread", cpu_s=5.4, replay_s=4.0, peak_s=2.0),
            lagging_run(tmp_path / "hot", "hot", cpu_s=5.4, replay_s=4.0, peak_s=3.7)]
    db = tmp_path / "f.duckdb"
    ingest(runs, db)
    write_diagnosis(db, DiagnosisRules())
    con = duckdb.connect(str(db), read_only=True)
    checks = signals.client_checks(con)
    assert checks["fine"]["client_cpu_share"] == pytest.approx(0.25)
    assert checks["fine"]["client_cpu_ms_per_1k_tokens"] == pytest.approx(1.0 * 1e6 / 200)  # 5,000 ms
    assert checks["fine"]["arrival_ratio"] == pytest.approx(1.0)
    assert checks["late"]["arrival_ratio"] == pytest.approx(0.1 / 0.12)
    assert checks["closed"]["arrival_ratio"] is None  # a closed loop has no schedule to keep
    warnings = dict(con.execute("SELECT experiment, warnings FROM diagnosis").fetchall())
    assert "client-limited" not in warnings["fine"] and "client-limited" not in warnings["closed"]
    assert "client-limited (its busiest process used 95 % of a core" in warnings["busy"]
    assert checks["spread"]["client_cpu_share"] == pytest.approx(0.5)  # the busiest, not the sum
    assert checks["spread"]["client_cpu_ms_per_1k_tokens"] == pytest.approx(5.4 * 1e6 / 200)  # all of them
    assert "client-limited" not in warnings["spread"]
    assert "client-limited (its busiest process used 92 % of a core" in warnings["hot"]
    assert "client-limited (sent 83 % of the scheduled arrival rate" in warnings["late"]
