"""DuckDB ingestion of real run folders: idempotent, and a half-written folder is refused."""

import duckdb
import pytest

from filledfirst import atomic
from filledfirst.records import REQUEST_SCHEMA, SAMPLE_SCHEMA, TOKEN_SCHEMA, RequestRecord, TokenRecord, to_table
from filledfirst.run import folder
from filledfirst.store.ingest import ingest


def make_run(path, run_id, status="ok"):
    path.mkdir()
    reqs = [RequestRecord(i, "decode", 10, 4, 0.1 * i, 0.1 * i, 0.1 * i + 0.05, 0.1 * i + 0.08, 0.1 * i + 0.09,
                          10, 4, 3)
            for i in range(5)]
    atomic.write_parquet(to_table(reqs, REQUEST_SCHEMA), path / folder.REQUESTS)
    atomic.write_parquet(to_table([TokenRecord(0, 0, 0.05, 1)], TOKEN_SCHEMA), path / folder.TOKENS)
    atomic.write_parquet(to_table([], SAMPLE_SCHEMA), path / folder.SAMPLES)
    atomic.write_json({"run_id": run_id, "experiment": run_id.split("-")[0], "status": status}, path / folder.RUN_JSON)
    return path


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
    failed = tmp_path / "failed"
    failed.mkdir()
    atomic.write_json({"run_id": "bad-1", "experiment": "bad", "status": "failed", "error": "vLLM exited"},
                      failed / folder.RUN_JSON)
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
