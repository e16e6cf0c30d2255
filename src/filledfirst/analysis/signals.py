"""Every signal the report shows, defined once, as SQL over the DuckDB store.

The report, tests and any later diagnosis read numbers only through these functions, so a
definition (what TTFT is measured from, how ITL treats multi-token chunks, which
Prometheus names count as the KV gauge) changes in one place.

Definitions (times are seconds on the run's one monotonic clock):
- TTFT = t_first_token - t_scheduled. The load generator is open loop, so TTFT counts
  from the request's *arrival* (its scheduled time), including any client-side lag.
- ITL = gap between consecutive token-carrying chunks of one request, divided by the
  tokens in the later chunk; one value per gap, pooled over all requests of a group.
- Latency percentiles (TTFT, ITL) use only requests with status `ok`; failed requests are
  counted (n, n_failed) and never dropped from denominators of counts.
- running / waiting: per scrape time, summed over engines (label sets); KV: max over
  engines, as a percentage. Preemptions: counter max - min over the run, per label set,
  summed over label sets. Only differences of counters within a run are used, never
  their absolute values: runs that share one server start (filledfirst.config.
  server_groups) see counters that go on from the run before, and need no reset.
- Whole run for now: no warm-up or drain window is cut.
"""

from __future__ import annotations

import json
from typing import Any

import duckdb
import polars as pl

RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
# vLLM renamed the KV gauge; older builds expose the gpu_ name (also on the CPU).
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
# The counter's sample name carries `_total`; a scraper that stores the family name keeps
# it without. `_created` (a timestamp) must never match, hence an explicit list.
PREEMPTIONS = ("vllm:num_preemptions_total", "vllm:num_preemptions")

OK = "ok"


def _in_list(names: tuple[str, ...]) -> str:
    # Constant metric names from this module, never user input: safe to inline.
    return ", ".join("'" + n.replace("'", "''") + "'" for n in names)


# Per-request TTFT in ms, NULL unless the request succeeded and produced a first token.
_REQUEST_TTFT = f"""
SELECT run_id, request_id, role, status, error, t_scheduled,
       CASE WHEN status = '{OK}' THEN (t_first_token - t_scheduled) * 1000 END AS ttft_ms,
       -- dispatch lag: how late the client sent; large values mean the client, not the
       -- server, was the limit (open loop; ~0 by construction in a closed loop)
       (t_sent - t_scheduled) * 1000 AS lag_ms
FROM requests
"""

# One row per inter-chunk gap of an ok request. Chunks with n = 0 (e.g. the final usage
# chunk) carry no token, so they are dropped before the gaps are taken.
_ITL_GAPS = f"""
WITH chunks AS (
    SELECT k.run_id, k.request_id, r.role, k."index" AS idx, k.t, k.n
    FROM tokens k
    JOIN requests r USING (run_id, request_id)
    WHERE r.status = '{OK}' AND k.n > 0
),
gaps AS (
    SELECT run_id, request_id, role,
           (t - lag(t) OVER (PARTITION BY run_id, request_id ORDER BY idx)) / n * 1000 AS itl_ms
    FROM chunks
)
SELECT run_id, request_id, role, itl_ms FROM gaps WHERE itl_ms IS NOT NULL
"""

# Long-format scheduler signals: one value per (run, scrape time, signal).
_GAUGES = f"""
WITH tagged AS (
    SELECT run_id, t, value,
           CASE WHEN metric IN ({_in_list(RUNNING)}) THEN 'running'
                WHEN metric IN ({_in_list(WAITING)}) THEN 'waiting'
                ELSE 'kv_pct' END AS signal
    FROM samples
    WHERE metric IN ({_in_list(RUNNING + WAITING + KV_USAGE)})
)
SELECT run_id, t, signal,
       CASE WHEN signal = 'kv_pct' THEN max(value) * 100 ELSE sum(value) END AS value
FROM tagged
GROUP BY run_id, t, signal
"""

_PREEMPTIONS = f"""
WITH per_series AS (
    SELECT run_id, metric, max(value) - min(value) AS delta
    FROM samples WHERE metric IN ({_in_list(PREEMPTIONS)})
    GROUP BY run_id, metric, labels
),
per_name AS (SELECT run_id, metric, sum(delta) AS n FROM per_series GROUP BY run_id, metric)
-- If a scraper stored both spellings of the counter, they describe the same events.
SELECT run_id, max(n) AS preemptions FROM per_name GROUP BY run_id
"""


def _pl(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> pl.DataFrame:
    # Via Arrow: keeps column types even when no row matches.
    out = pl.from_arrow(con.sql(sql, params=params or None).to_arrow_table())
    assert isinstance(out, pl.DataFrame)
    return out


def run_summary(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """One row per run (failed runs included, with NULL signals)."""
    sql = f"""
    WITH req AS (
        SELECT run_id, count(*) AS n_requests,
               count(*) FILTER (WHERE status = '{OK}') AS n_ok,
               quantile_cont(ttft_ms, 0.5) AS ttft_p50_ms,
               quantile_cont(ttft_ms, 0.9) AS ttft_p90_ms,
               quantile_cont(ttft_ms, 0.99) AS ttft_p99_ms,
               quantile_cont(lag_ms, 0.5) AS lag_p50_ms,
               quantile_cont(lag_ms, 0.99) AS lag_p99_ms
        FROM ({_REQUEST_TTFT}) GROUP BY run_id
    ),
    itl AS (
        SELECT run_id, quantile_cont(itl_ms, 0.5) AS itl_p50_ms,
               quantile_cont(itl_ms, 0.99) AS itl_p99_ms
        FROM ({_ITL_GAPS}) GROUP BY run_id
    ),
    g AS (
        SELECT run_id,
               quantile_cont(value, 0.5) FILTER (WHERE signal = 'running') AS running_median,
               max(value) FILTER (WHERE signal = 'running') AS running_max,
               quantile_cont(value, 0.5) FILTER (WHERE signal = 'waiting') AS waiting_median,
               max(value) FILTER (WHERE signal = 'waiting') AS waiting_max,
               quantile_cont(value, 0.5) FILTER (WHERE signal = 'kv_pct') AS kv_median_pct,
               max(value) FILTER (WHERE signal = 'kv_pct') AS kv_max_pct
        FROM ({_GAUGES}) GROUP BY run_id
    )
    SELECT r.run_id, r.experiment, r.description, r.status, r.error,
           coalesce(req.n_requests, 0) AS n_requests,
           coalesce(req.n_ok, 0) AS n_ok,
           coalesce(req.n_requests - req.n_ok, 0) AS n_failed,
           req.ttft_p50_ms, req.ttft_p90_ms, req.ttft_p99_ms,
           itl.itl_p50_ms, itl.itl_p99_ms,
           g.running_median, g.running_max, g.waiting_median, g.waiting_max,
           g.kv_median_pct, g.kv_max_pct,
           p.preemptions,
           req.lag_p50_ms, req.lag_p99_ms,
           r.max_num_seqs, r.duration_s
    FROM runs r
    LEFT JOIN req USING (run_id)
    LEFT JOIN itl USING (run_id)
    LEFT JOIN g USING (run_id)
    LEFT JOIN ({_PREEMPTIONS}) p USING (run_id)
    ORDER BY r.started_at NULLS LAST, r.run_id
    """
    return _pl(con, sql)


def role_summary(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """Per run and role: the seed's prefill-decode interference table."""
    sql = f"""
    WITH req AS (
        SELECT run_id, role, count(*) AS n,
               count(*) FILTER (WHERE status <> '{OK}') AS n_failed,
               quantile_cont(ttft_ms, 0.5) AS ttft_p50_ms,
               quantile_cont(ttft_ms, 0.9) AS ttft_p90_ms,
               min(t_scheduled) AS first_arrival
        FROM ({_REQUEST_TTFT}) GROUP BY run_id, role
    ),
    itl AS (
        SELECT run_id, role, quantile_cont(itl_ms, 0.5) AS itl_p50_ms,
               quantile_cont(itl_ms, 0.99) AS itl_p99_ms
        FROM ({_ITL_GAPS}) GROUP BY run_id, role
    )
    SELECT req.run_id, req.role, req.n, req.n_failed, req.ttft_p50_ms, req.ttft_p90_ms,
           itl.itl_p50_ms, itl.itl_p99_ms
    FROM req LEFT JOIN itl USING (run_id, role)
    -- first arrival order: roles appear in the order the workload starts them
    ORDER BY req.run_id, req.first_arrival, req.role
    """
    return _pl(con, sql)


def timeseries(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    """Long format: t, signal (running | waiting | kv_pct), value; ordered by time."""
    sql = f"SELECT t, signal, value FROM ({_GAUGES}) WHERE run_id = ? ORDER BY signal, t"
    return _pl(con, sql, [run_id])


def request_points(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    """Per request: request_id, t_scheduled, ttft_ms (NULL if failed), role, status, error."""
    sql = f"""
    SELECT request_id, t_scheduled, ttft_ms, role, status, error
    FROM ({_REQUEST_TTFT}) WHERE run_id = ? ORDER BY t_scheduled, request_id
    """
    return _pl(con, sql, [run_id])


def run_meta(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, Any]]:
    """run_id -> the full run.json, in run_summary's order, for the report's Setup."""
    rows = con.execute(
        "SELECT run_id, meta FROM runs ORDER BY started_at NULLS LAST, run_id"
    ).fetchall()
    return {run_id: json.loads(meta) if meta else {} for run_id, meta in rows}
