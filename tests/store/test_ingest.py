"""DuckDB ingestion of real run folders: idempotent, and a half-written folder is refused."""

import duckdb
import pytest

from filledfirst import atomic
from filledfirst.contracts.records import (
    REQUEST_SCHEMA,
    RequestRecord,
    to_table,
)
from filledfirst.run import folder
from filledfirst.store.ingest import ingest

from helpers.run_folder import make_run, write_run


def counts(db):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in ("runs", "requests", "tokens")}
    finally:
        con.close()


def test_ingesting_twice_leaves_one_copy(tmp_path):
    a, b = make_run(tmp_path / "a", "ref-1"), make_run(tmp_path / "b", "lim-1")
    db = tmp_path / "f.duckdb"
    ingest([a, b], db)
    ingest([a], db)
    ingest([a, b], db)
    assert counts(db) == {"runs": 2, "requests": 10, "tokens": 2}
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_half_written_folder_is_refused_before_anything_is_written(tmp_path):
    good = make_run(tmp_path / "good", "ref-1")
    half = make_run(tmp_path / "half", "lim-1")
    (half / folder.RUN_JSON).unlink()  # run.json is written last: without it the folder is unfinished
    db = tmp_path / "f.duckdb"
    with pytest.raises(folder.IncompleteRunDir, match="did not finish"):
        ingest([good, half], db)
    assert not db.exists()

    (good / folder.TOKENS).unlink()
    with pytest.raises(folder.IncompleteRunDir, match="tokens.parquet missing"):
        ingest([good], db)


def test_failed_run_without_measurements_is_ingested(tmp_path):
    failed = write_run(tmp_path / "failed",
                       {"run_id": "bad-1", "experiment": "bad", "status": "failed", "error": "vLLM exited"})
    db = tmp_path / "f.duckdb"
    ingest([failed], db)
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT status, error FROM runs").fetchall() == [("failed", "vLLM exited")]


def test_the_servers_request_timings_are_stored_and_old_folders_load_without(tmp_path):
    new = make_run(tmp_path / "new", "new-1")
    reqs = [RequestRecord(0, "decode", 10, 4, 0.0, 0.0, 0.05, 0.05, 0.09, 0.09, 10, 4, 4, server_queue_ms=1.5,
                          server_prefill_ms=40.0, server_decode_ms=39.0, server_itl_ms=13.0)]
    atomic.write_parquet(to_table(reqs, REQUEST_SCHEMA), new / folder.REQUESTS)
    old = make_run(tmp_path / "old", "old-1")
    table = to_table(reqs, REQUEST_SCHEMA)
    atomic.write_parquet(table.drop([n for n in table.column_names if n.startswith("server_")]), old / folder.REQUESTS)
    db = tmp_path / "f.duckdb"
    ingest([new, old], db)
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT run_id, server_queue_ms, server_prefill_ms, server_decode_ms, server_itl_ms "
                           "FROM requests ORDER BY run_id").fetchall()
    assert rows == [("new-1", 1.5, 40.0, 39.0, 13.0), ("old-1", None, None, None, None)]


@pytest.mark.parametrize("name", ["r[1]", "r?", "r*", "r[!x]"])
def test_a_folder_named_like_a_glob_pattern_loads_its_own_files(tmp_path, name):
    """`g/r[1]/requests.parquet` read as a pattern is `g/r1/requests.parquet`: another
    run's rows under this run's id. The file is read, not a pattern."""
    group = tmp_path / "g"
    group.mkdir()
    make_run(group / "r1", "other-1", n=3)
    odd = make_run(group / name, "odd-1", n=7)
    db = tmp_path / "f.duckdb"
    ingest([odd], db)
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT run_id, count(*) FROM requests GROUP BY run_id").fetchall() == [("odd-1", 7)]
        assert con.execute("SELECT count(*) FROM tokens").fetchall()[0][0] == 1


# Ingests one run and, inside the database's copy (after the copy, before the rename),
# says so and waits for a file to appear: a second ingest is started meanwhile.
_PAUSED_INGEST = """
import pathlib, sys, time
from filledfirst.store import ingest as m
run_dir, db, ready, go = map(pathlib.Path, sys.argv[1:])
original = m._ingest_one
def paused(*args):
    original(*args)
    ready.touch()
    while not go.exists():
        time.sleep(0.01)
m._ingest_one = paused
m.ingest([run_dir], db)
"""


def test_two_ingests_at_once_keep_both_runs(tmp_path):
    """Each ingest edits a copy of the database and renames it in: without a lock the
    later rename drops the other's runs. The second waits for the first (and says so)."""
    import subprocess
    import sys
    import time

    a, b = make_run(tmp_path / "a", "ref-1"), make_run(tmp_path / "b", "lim-1")
    db, ready, go = tmp_path / "f.duckdb", tmp_path / "ready", tmp_path / "go"
    ingest([make_run(tmp_path / "c", "old-1")], db)  # a database that exists already
    first = subprocess.Popen([sys.executable, "-c", _PAUSED_INGEST, str(a), str(db), str(ready), str(go)],
                             stderr=subprocess.PIPE, text=True)
    try:
        while not ready.exists():
            assert first.poll() is None, first.stderr.read()
            time.sleep(0.01)
        log = tmp_path / "second.log"
        with log.open("w") as err:
            second = subprocess.Popen([sys.executable, "-m", "filledfirst", "ingest", str(b), "--db", str(db)],
                                      stderr=err)
            # Until it has finished, or says it waits for the lock.
            while second.poll() is None and "waiting for the lock" not in log.read_text():
                time.sleep(0.01)
        go.touch()
        assert first.wait(timeout=120) == 0, first.stderr.read()
        assert second.wait(timeout=120) == 0, log.read_text()
    finally:
        go.touch()
        for proc in (first, second):
            if proc.poll() is None:
                proc.kill()
    with duckdb.connect(str(db), read_only=True) as con:
        assert sorted(r[0] for r in con.execute("SELECT run_id FROM runs").fetchall()) == ["lim-1", "old-1", "ref-1"]
    assert "waiting for the lock" in log.read_text()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp file, no lock left
