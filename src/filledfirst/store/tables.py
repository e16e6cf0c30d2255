"""Questions about the database itself, asked the one way."""

from __future__ import annotations

from typing import Mapping, Sequence

import duckdb
import msgspec
import polars as pl


def table_exists(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether the database holds table `name` (an older database, or one a stage has not
    written yet, may lack it)."""
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]
                            ).fetchall()[0][0])


def replace_table(con: duckdb.DuckDBPyConnection, name: str, records: Sequence[msgspec.Struct],
                  schema: Mapping[str, pl.DataType | type[pl.DataType]]) -> None:
    """Table `name` replaced by `records` (typed records, one row each), with `schema`'s
    column types, so that an empty table keeps its columns."""
    frame = pl.DataFrame([msgspec.structs.asdict(r) for r in records], schema=schema)
    view = f"_{name}_new"
    con.register(view, frame.to_arrow())
    try:
        con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT * FROM {view}")
    finally:
        con.unregister(view)
