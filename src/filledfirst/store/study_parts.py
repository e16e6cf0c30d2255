"""The study's sections (the config's `sections`), kept in the database beside the diagnosis, so
the report lays out the study it was diagnosed with without reading a config."""

from __future__ import annotations

import json
from collections.abc import Mapping

import duckdb
import msgspec

from filledfirst.store.tables import table_exists
from filledfirst.study import Section

_TABLE = "study_parts"


def store_parts(con: duckdb.DuckDBPyConnection, parts: Mapping[str, Section]) -> None:
    """The study's parts, in order, as table `study_parts` (one JSON document)."""
    con.execute(f"CREATE OR REPLACE TABLE {_TABLE} (parts JSON)")
    con.execute(f"INSERT INTO {_TABLE} VALUES (?)", [json.dumps(msgspec.to_builtins(dict(parts)))])


def stored_parts(con: duckdb.DuckDBPyConnection) -> dict[str, Section]:
    """The parts the database was diagnosed with; none for a database without."""
    if not table_exists(con, _TABLE):
        return {}
    rows = con.execute(f"SELECT parts FROM {_TABLE}").fetchall()
    return msgspec.convert(json.loads(rows[0][0]), dict[str, Section]) if rows else {}
