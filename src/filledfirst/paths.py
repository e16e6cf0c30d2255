"""The files the package ships beside its code (package data), wherever it is installed."""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent
SCHEMA_PATH = _HERE / "schemas" / "config.schema.yaml"
SECTIONS_DIR = _HERE / "sections"  # the shipped sections files (`sections: original-study.yaml`)
# The results database's name in a results folder (the workflow's results/filledfirst.duckdb).
RESULTS_DB = "filledfirst.duckdb"


def results_database(path: str | Path) -> Path:
    """The results database a path names: the file, or the results folder holding it."""
    path = Path(path)
    return path / RESULTS_DB if path.is_dir() else path
