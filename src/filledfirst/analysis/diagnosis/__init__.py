"""What filled first: one label per run, from the stored signals only.

Every number comes from the DuckDB tables (through `signals` where it defines one); the
rules are the seed's patterns table made explicit, with thresholds in `DiagnosisRules`.
Scheduler signals are judged over the *loaded window* (`window`): from the first arrival
of a sent request plus `warmup_frac` of the sent requests' arrival span (the server still
filling) to their last arrival (after it the queue only drains, which would make any
overload look like a long tail of waiting), cut at the last scrape. Every column measured
over the window is named `window_*` (or is a share of it), so it is never confused with
`signals.run_summary`'s whole-run column of the same signal (`window_running_max` against
`running_max`). TTFT, dispatch lag and vLLM's queue time keep their whole-run definitions
from `signals`; first crossings are on the run's clock.

The stages, a module each: `window` (the loaded window), `sql` (the windowed SQL, a row
per run), `features` (that row typed, with Little's law, goodput and the KV ledger of
`kv_ledger` derived), `rules` (one rule per label of `labels.Label`, with its clue),
`caveats` (the warnings) and `storage` (tables `diagnosis` and `diagnosis_rules`).

Columns beyond the ones the report reads: `notes` (what could not be checked and why),
`cap` (the max_num_seqs used, per engine), `engines`, `window_scrapes`,
`window_running_median`, `window_running_max`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import duckdb
import polars as pl

from filledfirst.analysis import signals, step_time
from filledfirst.analysis.diagnosis import scheduler
from filledfirst.analysis.diagnosis.caveats import warnings
from filledfirst.analysis.diagnosis.features import features
from filledfirst.analysis.diagnosis.rules import judge
from filledfirst.analysis.diagnosis.sql import SUMMARY_COLUMNS, measure
from filledfirst.analysis.diagnosis.storage import SCHEMA, store, stored_row
from filledfirst.analysis.diagnosis.window import windows
from filledfirst.contracts import runmeta
from filledfirst.errors import UserError
from filledfirst.store.ingest import edited_copy, upgrade
from filledfirst.store.study_parts import store_parts
from filledfirst.store.tables import table_exists
from filledfirst.study import DiagnosisRules

__all__ = ["diagnose", "write_diagnosis"]


def diagnose(con: duckdb.DuckDBPyConnection, rules: DiagnosisRules,
             expect: Mapping[str, str] | None = None) -> pl.DataFrame:
    """One row per run. `expect`: experiment -> designed-for label, for runs whose
    run.json does not carry `spec.expect` (e.g. from the config the CLI was given)."""
    return _diagnose(con, rules, expect)[0]


def _diagnose(con: duckdb.DuckDBPyConnection, rules: DiagnosisRules, expect: Mapping[str, str] | None
              ) -> tuple[pl.DataFrame, list[scheduler.SchedulerState], list[step_time.StepModel]]:
    full = signals.run_summary(con)
    summary = full.select(*SUMMARY_COLUMNS)
    metas = signals.run_metas(con)
    window = windows(con, summary, metas, rules)
    all_states = scheduler.states(con, {
        w["run_id"]: scheduler.RunLimits(w["cap"], w["budget"], w["hold"]) for w in window.to_dicts()}, rules)
    states = _by_run(all_states)
    rows = []
    for row in measure(con, summary, window, rules):
        meta = metas.get(row["run_id"]) or runmeta.unknown(row["run_id"])
        bound = scheduler.bindings(states.get(row["run_id"], []), row["start"] or 0.0, row["stop"] or 0.0, row["hold"])
        f = features(row, meta, rules, bound)
        rows.append(stored_row(f, meta.expect or (expect or {}).get(f.experiment), judge(f, rules), warnings(f, rules)))
    itl = dict(full.select("run_id", "itl_p50_ms").iter_rows())
    return pl.DataFrame(rows, schema=SCHEMA), all_states, step_time.models(all_states, metas, itl)


def _by_run(states: list[scheduler.SchedulerState]) -> dict[str, list[scheduler.SchedulerState]]:
    out: dict[str, list[scheduler.SchedulerState]] = {}
    for s in states:
        out.setdefault(s.run_id, []).append(s)
    return out


def write_diagnosis(db_path: str | Path, rules: DiagnosisRules,
                    expect: Mapping[str, str] | None = None, parts: Mapping[str, object] | None = None) -> pl.DataFrame:
    """Compute the diagnosis and store it as table `diagnosis` (with `scheduler_states` and
    `step_models` beside it), swapping the file in whole;
    with `parts` (the study's, filledfirst.study.Section by name) also table `study_parts`."""
    if not Path(db_path).is_file():
        raise UserError(f"{db_path}: no such database (run `filledfirst ingest` first)")
    with edited_copy(db_path) as con:
        if not table_exists(con, "runs"):
            raise UserError(f"{db_path}: no runs table (run `filledfirst ingest` first)")
        upgrade(con)  # a database ingested before the requests gained a column
        df, states, step_models = _diagnose(con, rules, expect)
        store(con, df, rules)
        scheduler.store(con, states)
        step_time.store(con, step_models)
        if parts is not None:
            store_parts(con, parts)
    return df
