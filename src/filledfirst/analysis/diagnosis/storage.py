"""Tables `diagnosis` (a row per run: its label, clue, warnings and features) and
`diagnosis_rules` (the thresholds the labels were made with, so the report states those,
not the defaults)."""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from typing import Any

import duckdb
import polars as pl

from filledfirst.analysis.diagnosis.features import Features
from filledfirst.analysis.diagnosis.rules import Verdict
from filledfirst.store.tables import table_exists
from filledfirst.study import DiagnosisRules

SCHEMA = {
    "run_id": pl.String, "experiment": pl.String, "expect": pl.String, "label": pl.String,
    "clue": pl.String, "then_filled": pl.String, "warnings": pl.String, "notes": pl.String, "cap": pl.Int64,
    "engines": pl.Int64,
    "window_start_s": pl.Float64, "window_end_s": pl.Float64,
    "running_at_cap_share": pl.Float64, "waiting_share": pl.Float64, "window_running_median": pl.Float64,
    "window_running_max": pl.Float64, "window_kv_median_pct": pl.Float64, "window_kv_max_pct": pl.Float64,
    "kv_full_share": pl.Float64, "window_waiting_median": pl.Float64, "window_preemptions": pl.Float64,
    "queue_time_p50_ms": pl.Float64, "ttft_p50_ms": pl.Float64, "ttft_p90_ms": pl.Float64, "ttft_timeouts": pl.Int64,
    "failed_share": pl.Float64, "lag_p99_ms": pl.Float64, "first_crossings": pl.String,
    "littles_L_server": pl.Float64, "littles_lambda_W": pl.Float64, "littles_ratio": pl.Float64,
    "littles_ok": pl.Boolean, "goodput_rps": pl.Float64, "slo_met_share": pl.Float64,
    "kv_bytes_per_token": pl.Float64, "kv_capacity_tokens": pl.Float64, "kv_fit_concurrency": pl.Float64,
    "interference_ratio": pl.Float64, "scrape_coverage": pl.Float64, "window_scrapes": pl.Int64,
    "window_queue_share": pl.Float64, "window_timed": pl.Int64, "interference_prefill_ratio": pl.Float64,
    "client_cpu_share": pl.Float64, "client_cpu_ms_per_1k_tokens": pl.Float64, "arrival_ratio": pl.Float64,
    "token_budget": pl.Int64, "budget_queued_steps": pl.Int64, "budget_fill": pl.Float64,
    "prefix_caching": pl.Boolean, "ideal_hit_share": pl.Float64, "measured_hit_share": pl.Float64,
    "cache_efficiency": pl.Float64, "waited_request_s": pl.Float64, "bound": pl.String, "held_by": pl.String,
    "step_ms": pl.Float64, "prefill_share": pl.Float64, "engine": pl.String,
}


def stored_row(f: Features, expect: str | None, verdict: Verdict, warnings: list[str]) -> dict[str, Any]:
    """A row of table `diagnosis`: the features it stores, and the verdict."""
    values = asdict(f)
    values.update(held_by=verdict.held_by and verdict.held_by.value)
    values.update(expect=expect, label=verdict.label.value, clue=verdict.clue, then_filled=verdict.then_filled,
                  warnings="; ".join(warnings),
                  notes="; ".join(f.notes))
    return {column: values[column] for column in SCHEMA}


def store(con: duckdb.DuckDBPyConnection, diagnosis: pl.DataFrame, rules: DiagnosisRules) -> None:
    con.register("_diagnosis_new", diagnosis.to_arrow())
    con.execute("CREATE OR REPLACE TABLE diagnosis AS SELECT * FROM _diagnosis_new")
    con.unregister("_diagnosis_new")
    con.execute("CREATE OR REPLACE TABLE diagnosis_rules (rules JSON)")
    con.execute("INSERT INTO diagnosis_rules VALUES (?)", [json.dumps(asdict(rules))])


def stored_rules(con: duckdb.DuckDBPyConnection) -> DiagnosisRules:
    """The rules the stored diagnosis was made with (the defaults for a database without)."""
    if not table_exists(con, "diagnosis_rules"):
        return DiagnosisRules()
    rows = con.execute("SELECT rules FROM diagnosis_rules").fetchall()
    known = {f.name for f in fields(DiagnosisRules)}  # a database diagnosed by an older version kept others
    return DiagnosisRules.from_config({k: v for k, v in json.loads(rows[0][0]).items() if k in known} if rows else None)
