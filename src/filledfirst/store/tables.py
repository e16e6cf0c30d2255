"""Questions about the database itself, asked the one way."""

from __future__ import annotations

import duckdb


def table_exists(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether the database holds table `name` (an older database, or one a stage has not
    written yet, may lack it)."""
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]
                            ).fetchall()[0][0])
