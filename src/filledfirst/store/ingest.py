"""Load run folders into one DuckDB file. One writer; re-ingesting a run replaces it."""

from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from filledfirst.atomic import atomic_path
from filledfirst.contracts import runmeta
from filledfirst.contracts.records import REQUEST_SCHEMA, SAMPLE_SCHEMA, TOKEN_SCHEMA
from filledfirst.contracts.search import SEARCH_JSON, SearchRecord
from filledfirst.run import folder
from filledfirst.store.lock import write_lock

_ARROW_TO_SQL = {"int64": "BIGINT", "double": "DOUBLE", "string": "VARCHAR"}


def _columns(schema) -> str:
    return ", ".join(f'"{f.name}" {_ARROW_TO_SQL[str(f.type)]}' for f in schema)


DDL = f"""
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR PRIMARY KEY,
    experiment VARCHAR NOT NULL,
    workload VARCHAR,
    description VARCHAR,
    status VARCHAR NOT NULL,
    error VARCHAR,
    started_at VARCHAR,
    duration_s DOUBLE,
    max_num_seqs BIGINT,
    model VARCHAR,
    vllm_version VARCHAR,
    launcher VARCHAR,
    meta JSON,
    {", ".join(f"{name} {sql}" for name, sql in runmeta.RUN_COLUMNS.items())}
);
CREATE TABLE IF NOT EXISTS requests (run_id VARCHAR NOT NULL, {_columns(REQUEST_SCHEMA)});
CREATE TABLE IF NOT EXISTS tokens (run_id VARCHAR NOT NULL, {_columns(TOKEN_SCHEMA)});
CREATE TABLE IF NOT EXISTS samples (run_id VARCHAR NOT NULL, {_columns(SAMPLE_SCHEMA)});
-- a capacity search's search.json (filledfirst.run.search), its probes being runs
CREATE TABLE IF NOT EXISTS frontier_searches (
    frontier VARCHAR NOT NULL, setting VARCHAR NOT NULL, search JSON, PRIMARY KEY (frontier, setting)
);
"""

_TABLES = {"requests": folder.REQUESTS, "tokens": folder.TOKENS, "samples": folder.SAMPLES}
_SCHEMAS = {"requests": REQUEST_SCHEMA, "tokens": TOKEN_SCHEMA, "samples": SAMPLE_SCHEMA}


def upgrade(con: duckdb.DuckDBPyConnection) -> None:
    """The tables, and every column a record has gained since the database was written
    (NULL for the runs it holds), so what reads it can rely on the current schema."""
    con.execute(DDL)
    missing = [name for name in runmeta.RUN_COLUMNS if name not in _column_names(con, "runs")]
    for name in missing:
        con.execute(f"ALTER TABLE runs ADD COLUMN {name} {runmeta.RUN_COLUMNS[name]}")
    if missing:  # the runs already stored: their columns from their run.json
        for run_id, experiment, status, meta in con.execute(
                "SELECT run_id, experiment, status, meta FROM runs").fetchall():
            try:
                values = runmeta.run_columns(runmeta.from_row(run_id, experiment, status, meta))
            except ValueError:
                continue  # left NULL: signals.run_metas says why
            con.execute(f"UPDATE runs SET {', '.join(f'{k} = ?' for k in missing)} WHERE run_id = ?",
                        [*(values[k] for k in missing), run_id])
    for table, schema in _SCHEMAS.items():
        for f in schema:
            con.execute(f'ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "{f.name}" {_ARROW_TO_SQL[str(f.type)]}')


def _column_names(con: duckdb.DuckDBPyConnection, table: str) -> set[str]:
    return {r[0] for r in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = ?", [table]).fetchall()}


@contextmanager
def edited_copy(db_path: str | Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection to a copy of the database (or a new one), swapped in only if the block
    succeeds: readers and an interrupted writer never see a half-written file. One writer
    at a time: another waits for the database's lock (filledfirst.store.lock)."""
    db_path = Path(db_path)
    with write_lock(db_path), atomic_path(db_path, ".duckdb") as tmp:
        tmp.unlink()  # DuckDB wants a database file or none, not an empty one
        if db_path.exists():
            shutil.copyfile(db_path, tmp)
        con = duckdb.connect(str(tmp))
        try:
            yield con
            con.execute("CHECKPOINT")
        finally:
            con.close()


def _searches(paths: list[str | Path]) -> tuple[list[Path], list[SearchRecord]]:
    """Run folders, with a capacity search's search.json (or its folder) standing for
    its probe folders; and the searches."""
    run_dirs, searches = [], []
    for p in map(Path, paths):
        if p.is_dir() and not (p / folder.RUN_JSON).exists() and (p / SEARCH_JSON).is_file():
            p = p / SEARCH_JSON
        if p.name == SEARCH_JSON and p.is_file():
            search = SearchRecord.read(p)
            searches.append(search)
            run_dirs += search.run_dirs(p.parent)
        else:
            run_dirs.append(p)
    return run_dirs, searches


def ingest(run_dirs: list[str | Path], db_path: str | Path) -> list[str]:
    """Ingest the folders into a copy of the database and swap it in. Returns the run ids
    written. A capacity search's search.json (or its folder) brings its probe folders."""
    run_dirs, searches = _searches(run_dirs)
    metas = [(Path(d), folder.read_run_json(d)) for d in run_dirs]  # refuse before writing
    typed = [_typed(d, meta) for d, meta in metas]
    with edited_copy(db_path) as con:
        upgrade(con)
        for (run_dir, meta), t in zip(metas, typed):
            _ingest_one(con, run_dir, meta, t)
        for search in searches:
            con.execute("INSERT OR REPLACE INTO frontier_searches VALUES (?, ?, ?)",
                        [search.frontier, search.setting, json.dumps(search.to_doc())])
    return [t.run_id for t in typed]


def _typed(run_dir: Path, meta: dict) -> runmeta.RunMeta:
    try:
        return runmeta.decode(meta)
    except ValueError as exc:
        raise folder.IncompleteRunDir(f"{run_dir}: {exc}") from None


def _ingest_one(con: duckdb.DuckDBPyConnection, run_dir: Path, meta: dict, typed: runmeta.RunMeta) -> None:
    run_id = typed.run_id
    for table in ("runs", *_TABLES):
        con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
    row = {
        "run_id": run_id, "experiment": typed.experiment, "workload": typed.workload,
        "description": typed.description, "status": typed.status, "error": typed.error,
        "started_at": typed.started_at, "duration_s": typed.duration_s,
        "max_num_seqs": typed.server.settings.get("max_num_seqs"), "model": typed.model.name,
        "vllm_version": typed.versions.get("vllm"), "launcher": typed.server.launcher, "meta": json.dumps(meta),
        **runmeta.run_columns(typed),
    }
    con.execute(f"INSERT INTO runs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))
    for table, filename in _TABLES.items():
        path = run_dir / filename
        if path.is_file():
            # The file itself, in batches: DuckDB's read_parquet takes its path as a glob
            # pattern, and run folder r[1]'s would load r1's rows.
            with path.open("rb") as f:
                parquet = pq.ParquetFile(f)
                con.register("_ingest_rows", pa.RecordBatchReader.from_batches(
                    parquet.schema_arrow, parquet.iter_batches()))
                try:
                    # By name: a run folder written before a column existed still loads (NULLs).
                    con.execute(f"INSERT INTO {table} BY NAME SELECT ? AS run_id, * FROM _ingest_rows", [run_id])
                finally:
                    con.unregister("_ingest_rows")
