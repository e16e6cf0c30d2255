"""The loaded window of each run: from the first arrival of a sent request plus
`warmup_frac` of the sent requests' arrival span to their last arrival, cut at the last
scrape; with the cap a running count is judged against, how long a scrape's value holds
and the per-step token budget a step's tokens are judged against."""

from __future__ import annotations

import math
from typing import Mapping

import duckdb
import polars as pl

from filledfirst import request_metrics
from filledfirst.contracts import runmeta
from filledfirst.contracts.runmeta import RunMeta
from filledfirst.metrics import ENGINE_SQL, RUNNING, sql_list
from filledfirst.study import DiagnosisRules

# The name the window is registered under for the windowed SQL (filledfirst.analysis.diagnosis.sql).
WINDOW_TABLE = "_diagnosis_window"

SCHEMA = {"run_id": pl.String, "start": pl.Float64, "stop": pl.Float64, "cap": pl.Int64, "engines": pl.Int64,
          "at_cap": pl.Float64, "hold": pl.Float64, "budget": pl.Int64}

# Only what was measured: arrivals of requests that were sent (a run cut short has
# `not_sent` rows up to its schedule's end), and the server's gauges up to its last scrape.
_SPANS = f"""
WITH r AS (
    SELECT run_id, min(t_scheduled) AS first, max(t_scheduled) AS last, max(t_done) AS done
    FROM requests WHERE status <> '{request_metrics.NOT_SENT}' GROUP BY run_id
),
running AS (SELECT * FROM samples WHERE metric IN ({sql_list(RUNNING)})),
scrapes AS (SELECT DISTINCT run_id, t FROM running),
engines AS (  -- running is summed over engines, each with its own max_num_seqs
    SELECT run_id, count(DISTINCT {ENGINE_SQL}) AS engines
    FROM running GROUP BY run_id
),
s AS (  -- the interval as scraped, for runs whose run.json does not say it
    SELECT run_id, max(t) AS scraped, median(dt) AS interval
    FROM (SELECT *, t - lag(t) OVER (PARTITION BY run_id ORDER BY t) AS dt FROM scrapes) GROUP BY run_id
)
SELECT r.*, s.scraped, s.interval, e.engines FROM r LEFT JOIN s USING (run_id) LEFT JOIN engines e USING (run_id)
"""
def windows(con: duckdb.DuckDBPyConnection, summary: pl.DataFrame, metas: Mapping[str, RunMeta],
            rules: DiagnosisRules) -> pl.DataFrame:
    """Per run of `summary` (signals.run_summary): start, stop, cap, engines, at_cap (the
    running count that counts as at the cap, over all engines), hold (how long a
    scrape's value stands for) and budget (the per-step token budget, where known)."""
    spans = {r[0]: r[1:] for r in con.execute(_SPANS).fetchall()}
    rows = []
    for run_id, db_cap in summary.select("run_id", "max_num_seqs").iter_rows():
        first, last, done, scraped, scraped_interval, engines = spans.get(run_id, (None,) * 6)
        engines = engines or 1
        start = stop = None
        if first is not None:
            start, stop = first + rules.warmup_frac * (last - first), last
            if stop - start <= 0:  # one burst: no loaded window, judge the whole run instead
                start, stop = first, done if done is not None and done > first else first + 1.0
            if scraped is not None:  # a gauge is not known after the last scrape that read it
                stop = min(stop, scraped)
        meta = metas.get(run_id) or runmeta.unknown(run_id)
        cap = _cap(db_cap, meta, rules)
        interval = meta.scrape_interval_s or scraped_interval
        rows.append({"run_id": run_id, "start": start, "stop": stop, "cap": cap, "engines": engines,
                     "at_cap": None if cap is None else rules.cap_frac * cap * engines,
                     "hold": rules.scrape_hold_factor * interval if interval else math.inf,
                     "budget": meta.token_budget})
    return pl.DataFrame(rows, schema=SCHEMA)


def _cap(db_cap: int | None, meta: RunMeta, rules: DiagnosisRules) -> int | None:
    """The running set's cap in effect: max_num_active_seqs where the server had it (vLLM
    admits up to it), else max_num_seqs. runs.max_num_seqs is the server's setting as the
    runner recorded it; an external replay records none, so the spec's or the rules'
    value stands in."""
    for value in (db_cap, meta.max_num_seqs, rules.default_cap):
        if value is not None:
            active = meta.max_num_active_seqs
            return min(int(value), active) if active is not None else int(value)
    return meta.max_num_active_seqs
