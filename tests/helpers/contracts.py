"""The round trip every written contract file must make: decoded to its typed record as
written (absent keys UNSET) and encoded again, it is the same document; decoded for a
reader, every key it has reads back the same and every key it lacks reads None."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from filledfirst.contracts import runmeta
from filledfirst.contracts.runmeta import RunMeta
from filledfirst.contracts.search import SearchRecord
from filledfirst.contracts.stats import ScheduleStats, TraceStats


def record_type(path: Path) -> type[msgspec.Struct]:
    if path.name == "run.json":
        return RunMeta
    if path.name == "search.json":
        return SearchRecord
    if path.name.endswith(".stats.json"):
        return ScheduleStats
    return TraceStats


def assert_round_trips(path: str | Path) -> dict:
    """The file's document, after checking its round trip."""
    path = Path(path)
    doc = json.loads(path.read_text())
    as_written = msgspec.convert(doc, record_type(path))
    assert as_written.to_doc() == doc, path
    if path.name == "run.json":
        assert _present(runmeta.decode(doc).to_doc(), doc), path
    elif path.name.endswith(".stats.json"):
        assert _present(ScheduleStats.load(path).to_doc(), doc), path
    return doc


def _present(read: dict, doc: dict) -> bool:
    """`read` holds `doc`'s keys and values, and None for the keys `doc` lacks."""
    for key, value in read.items():
        if key not in doc:
            if value not in (None, {}, []) and not (isinstance(value, dict) and _present(value, {})):
                return False
        elif isinstance(value, dict) and isinstance(doc[key], dict):
            if not _present(value, doc[key]):
                return False
        elif value != doc[key]:
            return False
    return set(doc) <= set(read)  # a writer writes no key its record lacks
