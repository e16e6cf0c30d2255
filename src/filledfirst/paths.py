"""Where the package finds the workflow's files (an editable install in the repository)."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = Path(__file__).resolve().parent / "schemas" / "config.schema.yaml"  # package data
