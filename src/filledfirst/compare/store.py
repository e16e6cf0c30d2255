"""The comparison as tables of a DuckDB file, written whole or not at all:
compare_setup (key, base, candidate), compare_knees (filledfirst.compare.knees),
compare_runs (one row per experiment and figure, filledfirst.compare.figures),
compare_labels (one row per matched experiment: statuses, labels, offered rates, drifts),
compare_one_side (kind, name, side) and compare_about (the two databases and the rules)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl

from filledfirst import atomic
from filledfirst.compare import Comparison
from filledfirst.compare.figures import SEED

SCHEMAS = {
    "compare_setup": {"key": pl.String, "base": pl.String, "candidate": pl.String},
    "compare_knees": {
        "frontier": pl.String, "setting": pl.String, "base_lo_rps": pl.Float64, "base_floor_rps": pl.Float64,
        "base_hi_rps": pl.Float64, "cand_lo_rps": pl.Float64, "cand_floor_rps": pl.Float64,
        "cand_hi_rps": pl.Float64, "shift": pl.Float64, "min_shift": pl.Float64, "verdict": pl.String,
        "base_label": pl.String, "cand_label": pl.String, "label_changed": pl.Boolean, "base_drift": pl.Float64,
        "cand_drift": pl.Float64},
    "compare_runs": {
        "experiment": pl.String, "figure": pl.String, "unit": pl.String, "better": pl.String,
        "base": pl.Float64, "candidate": pl.Float64, "change": pl.Float64, "change_low": pl.Float64,
        "change_high": pl.Float64, "min_change": pl.Float64, "by": pl.String, "n_base": pl.Int64, "n_cand": pl.Int64,
        "verdict": pl.String},
    "compare_labels": {
        "experiment": pl.String, "base_run_id": pl.String, "cand_run_id": pl.String, "base_status": pl.String,
        "cand_status": pl.String, "expect": pl.String, "base_label": pl.String, "cand_label": pl.String,
        "label_changed": pl.Boolean, "base_offered_rps": pl.Float64, "cand_offered_rps": pl.Float64,
        "base_drift": pl.Float64, "cand_drift": pl.Float64},
    "compare_one_side": {"kind": pl.String, "name": pl.String, "side": pl.String},
}


def write(comparison: Comparison, path: Path) -> None:
    frames = {
        "compare_setup": comparison.setup, "compare_knees": comparison.knees, "compare_runs": comparison.runs,
        "compare_labels": comparison.labels, "compare_one_side": comparison.one_side,
    }
    rules = comparison.rules
    about = pl.DataFrame([{"base": str(comparison.base), "candidate": str(comparison.candidate),
                           "knee_min_shift": rules.knee_min_shift, "run_min_change": rules.run_min_change,
                           "confidence": rules.confidence, "resamples": rules.resamples, "seed": SEED}])
    with atomic.atomic_path(path, suffix=".duckdb") as work:
        work.unlink()  # DuckDB makes its own file; an empty one is not a database
        con = duckdb.connect(str(work))
        try:
            for name, rows in frames.items():
                df = pl.DataFrame(rows, schema=SCHEMAS[name])
                con.register("_new", df.to_arrow())
                con.execute(f"CREATE TABLE {name} AS SELECT * FROM _new")
                con.unregister("_new")
            con.register("_about", about.to_arrow())
            con.execute("CREATE TABLE compare_about AS SELECT * FROM _about")
        finally:
            con.close()
