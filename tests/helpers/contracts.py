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


def _present(read, doc) -> bool:
    """`read` holds `doc`'s keys and values, and None for the keys `doc` lacks."""
    if isinstance(read, dict) and isinstance(doc, dict):
        return set(doc) <= set(read) and all(  # a writer writes no key its record lacks
            _present(value, doc[key]) if key in doc else _empty(value) for key, value in read.items())
    if isinstance(read, list) and isinstance(doc, list):
        return len(read) == len(doc) and all(map(_present, read, doc))
    return read == doc


def _empty(value) -> bool:
    return value is None or value in ({}, []) or (isinstance(value, dict) and all(map(_empty, value.values())))
