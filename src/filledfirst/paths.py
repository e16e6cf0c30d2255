"""The files the package ships beside its code (package data), wherever it is installed."""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent
SCHEMA_PATH = _HERE / "schemas" / "config.schema.yaml"
PARTS_DIR = _HERE / "parts"  # the shipped studies' parts files (`parts: seed-study.yaml`)
