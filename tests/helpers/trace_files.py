"""Trace files in the 2024 Azure format, written by the tests: timestamps in microseconds
with no fraction on whole seconds, then the context and generated token counts."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
DAY0 = datetime(2024, 5, 12, tzinfo=timezone.utc)


def ts2024(offset_us: int) -> str:
    """The 2024 trace's format: microseconds, and no fraction at all on whole seconds."""
    t = DAY0 + timedelta(microseconds=offset_us)
    frac = f".{t.microsecond:06d}" if t.microsecond else ""
    return t.strftime("%Y-%m-%d %H:%M:%S") + frac + "+00:00"


def write_csv(path: Path, rows: list[tuple]) -> Path:
    path.write_text(HEADER + "".join(f"{t},{p},{o}\n" for t, p, o in rows))
    return path
