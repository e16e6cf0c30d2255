"""Every signal the report shows, defined once, as SQL over the DuckDB store.

The report, tests and any later diagnosis read numbers only through these functions, so a
definition (what TTFT is measured from, how ITL treats multi-token chunks) changes in one
place; which Prometheus names count as which signal is `filledfirst.metrics`. Every
column here is over the whole run; the diagnosis's loaded-window ones are `window_*`. TTFT
split along the request path by the server's own per-request timings is
`filledfirst.analysis.request_path`. The per-request ones (TTFT, the ITL gaps, a request's
stall, the SLO test) are `filledfirst.request_metrics`, which the capacity search judges
its probes with too.

Definitions (times are seconds on the run's one monotonic clock):
- TTFT = t_first_token - t_scheduled. The load generator is open loop, so TTFT counts
  from the request's *arrival* (its scheduled time), including any client-side lag.
- ITL: chunks of one request read at the same instant (one socket read) are one chunk
  (their tokens added up), since the gaps between them are the client's parsing, not the
  server's pace. Then, over the gaps between consecutive token-carrying chunks, pooled
  over all requests of a group, two conventions:
  itl_* = per token: the gap divided by the tokens of the later chunk (one value per gap);
  itl_chunk_* = per chunk: the undivided gap, as `vllm bench serve` records ITL.
  A request's stall (max_gap_ms) is its longest undivided gap: what the user waited.
- Latency percentiles (TTFT, ITL) use only requests with status `ok`; failed requests are
  counted (n, n_failed) and never dropped from denominators of counts. Requests that timed
  out before any token (ttft_timeouts) have a TTFT above the timeout the percentiles
  cannot show: they stand beside the percentiles wherever those are shown.
- `not_sent` requests (a run cut short before their time) are neither ok nor failed:
  counted apart (n_not_sent), out of every rate and share, since the server never saw them.
- Samples are read through `SAMPLES`: a value that is not finite (Prometheus' text allows
  NaN and +-Inf) is NULL, unknown. Table `samples` keeps it as the server wrote it, and
  run_summary counts them per run (nonfinite_samples), beside the failed scrapes.
- running / waiting: per scrape time, summed over engines (label sets); KV: max over
  engines, as a percentage; NULL at a scrape where an engine's value is unknown (a sum
  or maximum over the others would be a wrong number, not a smaller one). Counters
  (preemptions, histogram buckets) count by their increase over the run, as Prometheus'
  `increase`: the sum of the rises between consecutive finite scrapes of one label set,
  where a drop means the server restarted and counts from 0. Never their absolute
  values: runs that share one server start (filledfirst.config.server_groups) see
  counters that go on from the run before.
  Preemptions: summed over label sets.
- Server histograms (vLLM's TTFT, queue time, ...): each bucket's increase over the run;
  quantiles are interpolated linearly inside a bucket, as Prometheus' histogram_quantile
  does (the first bucket from 0; above the last finite bound, that bound).
- Rates of arrivals (the offered load, the rate the client sent at): (n - 1) / (last -
  first), `filledfirst.rates`; goodput is the offered load times the share that met the SLO.
- Whole run for now: no warm-up or drain window is cut.
"""

from __future__ import annotations

import logging
from typing import Any

import duckdb
import polars as pl

from filledfirst import metrics
from filledfirst.contracts import runmeta
from filledfirst.contracts.runmeta import RunMeta
from filledfirst.metrics import PREEMPTIONS, SCRAPE_ERROR, TTFT_HISTOGRAMS, sql_list
from filledfirst.rates import arrival_rate_sql
from filledfirst.request_metrics import FAILED, ITL_GAPS, NOT_SENT, OK, REQUEST_TTFT, ttft_ms

log = logging.getLogger(__name__)

# Offered load: the rate of the sent requests' arrivals (filledfirst.rates: NULL for one).
# Goodput is this rate times the share that met the objective, so a run where every
# request met it has goodput = offered load.
OFFERED = f"""
SELECT run_id, count(*) AS n_sent, max(t_scheduled) - min(t_scheduled) AS arrival_span_s,
       {arrival_rate_sql("t_scheduled")} AS offered_rps
FROM requests WHERE status <> '{NOT_SENT}' GROUP BY run_id
"""

# Did the client keep up? The CPU of its busiest process over the replay (one event loop:
# one core; runs from before worker processes have only the one), per 1,000 streamed
# tokens (all its processes), and the rate it sent at over the rate it was asked for.
CLIENT = f"""
WITH sent AS (
    SELECT run_id, {arrival_rate_sql("t_sent")} AS sent_rps,
           sum(output_tokens_received) AS tokens
    FROM requests WHERE status <> '{NOT_SENT}' AND t_sent IS NOT NULL GROUP BY run_id
)
SELECT r.run_id, r.client_cpu_s, coalesce(r.client_cpu_peak_s, r.client_cpu_s) / nullif(r.replay_s, 0)
           AS client_cpu_share,
       r.client_cpu_s * 1e6 / nullif(s.tokens, 0) AS client_cpu_ms_per_1k_tokens,
       CASE WHEN r.load_mode IS DISTINCT FROM 'closed' THEN s.sent_rps / nullif(o.offered_rps, 0) END
           AS arrival_ratio
FROM runs r LEFT JOIN sent s USING (run_id) LEFT JOIN ({OFFERED}) o USING (run_id)
"""


def client_checks(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, Any]]:
    """run_id -> client_cpu_s, client_cpu_share, client_cpu_ms_per_1k_tokens, arrival_ratio;
    nothing for a database ingested before runs had the client's columns."""
    have = {r[0] for r in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'runs'").fetchall()}
    if not {"client_cpu_s", "client_cpu_peak_s", "replay_s", "load_mode"} <= have:
        return {}
    return {r["run_id"]: r for r in query(con, CLIENT).to_dicts()}


# The samples every signal reads: a non-finite value is NULL before it reaches a sum, a
# maximum, a percentile or a chart (where NaN wins every max and a chart's JSON refuses it).
SAMPLES = "SELECT * REPLACE (CASE WHEN isfinite(value) THEN value END AS value) FROM samples"

# Per run: what the scraper could not use, as stored: failed scrapes and non-finite values.
SCRAPE_FAULTS = f"""
SELECT run_id, count(*) FILTER (WHERE metric = '{SCRAPE_ERROR}') AS scrape_errors,
       count(*) FILTER (WHERE NOT isfinite(value)) AS nonfinite_samples
FROM samples GROUP BY run_id
"""

# Long-format scheduler signals: one value per (run, scrape time, signal), NULL where an
# engine's value at that scrape is not known.
_SIGNAL_OF = " ".join(f"WHEN metric IN ({sql_list(g.names)}) THEN '{g.signal}'" for g in metrics.GAUGES)
_COMBINED = " ".join(f"WHEN signal = '{g.signal}' THEN {g.across_engines}(value) * {g.scale}" for g in metrics.GAUGES)
GAUGES = f"""
WITH tagged AS (
    SELECT run_id, t, value, CASE {_SIGNAL_OF} END AS signal
    FROM ({SAMPLES})
    WHERE metric IN ({sql_list(tuple(n for g in metrics.GAUGES for n in g.names))})
)
SELECT run_id, t, signal,
       CASE WHEN count(value) < count(*) THEN NULL
            {_COMBINED} END AS value
FROM tagged
GROUP BY run_id, t, signal
"""

def increase(source: str, keys: str) -> str:
    """Per `keys` (the counter's series), its increase over the rows of `source` (columns
    t, value and keys), as Prometheus' `increase` counts it (unextrapolated). A row whose
    value is unknown (NULL) is skipped: the rise across it still counts."""
    return f"""
    SELECT {keys}, sum(CASE WHEN prev IS NULL THEN 0 WHEN value >= prev THEN value - prev ELSE value END) AS delta
    FROM (SELECT {keys}, value, lag(value) OVER (PARTITION BY {keys} ORDER BY t) AS prev
          FROM ({source}) WHERE value IS NOT NULL)
    GROUP BY {keys}"""


def preemptions_sql(source: str) -> str:
    """Per run: preemptions over the counter samples of `source` (a subset of `samples`)."""
    return f"""
    WITH per_name AS (
        SELECT run_id, metric, sum(delta) AS n
        FROM ({increase(source, "run_id, metric, labels")}) GROUP BY run_id, metric
    )
    -- If a scraper stored both spellings of the counter, they describe the same events.
    SELECT run_id, max(n) AS preemptions FROM per_name GROUP BY run_id"""


_PREEMPTIONS = preemptions_sql(f"SELECT * FROM ({SAMPLES}) WHERE metric IN ({sql_list(PREEMPTIONS)})")


def query(con: duckdb.DuckDBPyConnection, sql: str,
          params: list[Any] | dict[str, Any] | None = None) -> pl.DataFrame:
    """The one way analysis code reads a query into polars: via Arrow, which keeps column
    types even when no row matches. `params`: positional (`?`) or named (`$name`)."""
    out = pl.from_arrow(con.sql(sql, params=params or None).to_arrow_table())
    assert isinstance(out, pl.DataFrame)
    return out


def run_summary(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """One row per run (failed runs included, with NULL signals)."""
    sql = f"""
    WITH req AS (
        SELECT run_id, count(*) AS n_requests,
               count(*) FILTER (WHERE status = '{OK}') AS n_ok,
               count(*) FILTER (WHERE {FAILED}) AS n_failed,
               count(*) FILTER (WHERE status = '{NOT_SENT}') AS n_not_sent,
               count(*) FILTER (WHERE status = 'timeout' AND ttft_missing) AS ttft_timeouts,
               quantile_cont(ttft_ms, 0.5) AS ttft_p50_ms,
               quantile_cont(ttft_ms, 0.9) AS ttft_p90_ms,
               quantile_cont(ttft_ms, 0.99) AS ttft_p99_ms,
               quantile_cont(ttft_content_ms, 0.5) AS ttft_content_p50_ms,
               quantile_cont(lag_ms, 0.5) AS lag_p50_ms,
               quantile_cont(lag_ms, 0.99) AS lag_p99_ms,
               CAST(coalesce(sum(reasoning_tokens), 0) AS BIGINT) AS reasoning_tokens,
               count(*) FILTER (WHERE usage_mismatch) AS n_usage_mismatch
        FROM ({REQUEST_TTFT}) GROUP BY run_id
    ),
    itl AS (
        SELECT run_id, quantile_cont(itl_ms, 0.5) AS itl_p50_ms,
               quantile_cont(itl_ms, 0.99) AS itl_p99_ms,
               quantile_cont(itl_chunk_ms, 0.5) AS itl_chunk_p50_ms,
               quantile_cont(itl_chunk_ms, 0.99) AS itl_chunk_p99_ms
        FROM ({ITL_GAPS}) GROUP BY run_id
    ),
    g AS (
        SELECT run_id,
               quantile_cont(value, 0.5) FILTER (WHERE signal = 'running') AS running_median,
               max(value) FILTER (WHERE signal = 'running') AS running_max,
               quantile_cont(value, 0.5) FILTER (WHERE signal = 'waiting') AS waiting_median,
               max(value) FILTER (WHERE signal = 'waiting') AS waiting_max,
               quantile_cont(value, 0.5) FILTER (WHERE signal = 'kv_pct') AS kv_median_pct,
               max(value) FILTER (WHERE signal = 'kv_pct') AS kv_max_pct
        FROM ({GAUGES}) GROUP BY run_id
    )
    SELECT r.run_id, r.experiment, r.description, r.status, r.error,
           coalesce(req.n_requests, 0) AS n_requests,
           coalesce(req.n_ok, 0) AS n_ok,
           coalesce(req.n_failed, 0) AS n_failed,
           coalesce(req.n_not_sent, 0) AS n_not_sent,
           req.ttft_p50_ms, req.ttft_p90_ms, req.ttft_p99_ms, coalesce(req.ttft_timeouts, 0) AS ttft_timeouts,
           req.ttft_content_p50_ms,
           itl.itl_p50_ms, itl.itl_p99_ms, itl.itl_chunk_p50_ms, itl.itl_chunk_p99_ms,
           g.running_median, g.running_max, g.waiting_median, g.waiting_max,
           g.kv_median_pct, g.kv_max_pct,
           p.preemptions,
           req.lag_p50_ms, req.lag_p99_ms, req.reasoning_tokens, req.n_usage_mismatch,
           r.max_num_seqs, r.duration_s,
           coalesce(sf.scrape_errors, 0) AS scrape_errors, coalesce(sf.nonfinite_samples, 0) AS nonfinite_samples
    FROM runs r
    LEFT JOIN ({SCRAPE_FAULTS}) sf USING (run_id)
    LEFT JOIN req USING (run_id)
    LEFT JOIN itl USING (run_id)
    LEFT JOIN g USING (run_id)
    LEFT JOIN ({_PREEMPTIONS}) p USING (run_id)
    ORDER BY r.started_at NULLS LAST, r.run_id
    """
    return query(con, sql)


def role_summary(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """Per run and role: the seed's prefill-decode interference table."""
    sql = f"""
    WITH req AS (
        SELECT run_id, role, count(*) AS n,
               count(*) FILTER (WHERE {FAILED}) AS n_failed,
               quantile_cont(ttft_ms, 0.5) AS ttft_p50_ms,
               quantile_cont(ttft_ms, 0.9) AS ttft_p90_ms,
               min(t_scheduled) AS first_arrival
        FROM ({REQUEST_TTFT}) GROUP BY run_id, role
    ),
    itl AS (
        SELECT run_id, role, quantile_cont(itl_ms, 0.5) AS itl_p50_ms,
               quantile_cont(itl_ms, 0.99) AS itl_p99_ms
        FROM ({ITL_GAPS}) GROUP BY run_id, role
    )
    SELECT req.run_id, req.role, req.n, req.n_failed, req.ttft_p50_ms, req.ttft_p90_ms,
           itl.itl_p50_ms, itl.itl_p99_ms
    FROM req LEFT JOIN itl USING (run_id, role)
    -- first arrival order: roles appear in the order the workload starts them
    ORDER BY req.run_id, req.first_arrival, req.role
    """
    return query(con, sql)


def timeseries(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    """Long format: t, signal (running | waiting | kv_pct), value; ordered by time."""
    sql = f"SELECT t, signal, value FROM ({GAUGES}) WHERE run_id = ? ORDER BY signal, t"
    return query(con, sql, [run_id])


def request_points(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    """Per request: request_id, t_scheduled, ttft_ms (NULL if failed), role, status, error."""
    sql = f"""
    SELECT request_id, t_scheduled, ttft_ms, role, status, error
    FROM ({REQUEST_TTFT}) WHERE run_id = ? ORDER BY t_scheduled, request_id
    """
    return query(con, sql, [run_id])


def run_metas(con: duckdb.DuckDBPyConnection) -> dict[str, RunMeta]:
    """run_id -> its run.json, typed (filledfirst.contracts.runmeta), in run_summary's order."""
    rows = con.execute(
        "SELECT run_id, experiment, status, meta FROM runs ORDER BY started_at NULLS LAST, run_id").fetchall()
    out = {}
    for row in rows:
        try:
            out[row[0]] = runmeta.from_row(*row)
        except ValueError as exc:  # stored before ingest checked it: known by its id alone
            log.warning("%s: %s", row[0], exc)
            out[row[0]] = runmeta.unknown(row[0])
    return out


def run_meta(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, Any]]:
    """run_id -> the full run.json as a document, in run_summary's order: for the
    report's setup dumps only (everything else reads run_metas)."""
    rows = con.execute(
        "SELECT run_id, meta FROM runs ORDER BY started_at NULLS LAST, run_id"
    ).fetchall()
    return {run_id: runmeta.loads(meta) if meta else {} for run_id, meta in rows}


# Per run and bucket bound: how many observations the server added during the run.
_BUCKETS = f"""
SELECT run_id, t, value,
       regexp_extract(labels, '(^|,)le=([^,]+)', 2) AS le,
       regexp_replace(labels, '(^|,)le=[^,]+', '') AS series
FROM ({SAMPLES}) WHERE list_contains(?, metric)"""
_HISTOGRAM_DELTAS = f"""
WITH per_series AS ({increase(_BUCKETS, "run_id, series, le")})
SELECT run_id, CAST(le AS DOUBLE) AS le, sum(delta) AS cum
FROM per_series GROUP BY run_id, le ORDER BY run_id, CAST(le AS DOUBLE)
"""


def histogram_quantile(con: duckdb.DuckDBPyConnection, histograms: tuple[str, ...], q: float) -> pl.DataFrame:
    """Per run: the q-quantile of a server histogram (its family names, one per engine that
    has it: filledfirst.metrics.TTFT_HISTOGRAMS) over the run, with the bucket it fell in and
    the number of observations."""
    deltas = query(con, _HISTOGRAM_DELTAS, [[h + "_bucket" for h in histograms]])
    rows = []
    for (run_id,), g in deltas.group_by(["run_id"], maintain_order=True):
        les, cums = g["le"].to_list(), g["cum"].to_list()
        total = cums[-1]  # the +Inf bucket
        value = lo = hi = None
        if total > 0:
            rank = q * total
            prev_le, prev_cum = 0.0, 0.0
            for le, cum in zip(les, cums):
                if cum >= rank:
                    lo, hi = prev_le, le
                    # Above the last finite bound nothing is known: report that bound.
                    if le == float("inf"):
                        value = prev_le
                    else:
                        value = prev_le + (le - prev_le) * (rank - prev_cum) / max(cum - prev_cum, 1e-12)
                    break
                prev_le, prev_cum = le, cum
        rows.append({"run_id": run_id, "value": value, "bucket_lo": lo, "bucket_hi": hi, "n": total})
    schema = {"run_id": pl.String, "value": pl.Float64, "bucket_lo": pl.Float64, "bucket_hi": pl.Float64,
              "n": pl.Float64}
    return pl.DataFrame(rows, schema=schema)


def ttft_against_server(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """Our TTFT p50 (from send, as the server sees it) beside the median of the server's own
    TTFT histogram for the same run: a check of the client, and of what HTTP adds."""
    ours = query(con, f"""
        SELECT run_id, quantile_cont(ttft_from_send_ms, 0.5) AS client_ttft_p50_ms,
               count(ttft_from_send_ms) AS n_client
        FROM ({REQUEST_TTFT}) GROUP BY run_id""")
    server = histogram_quantile(con, TTFT_HISTOGRAMS, 0.5).select(
        "run_id",
        (pl.col("value") * 1000).alias("server_ttft_p50_ms"),
        (pl.col("bucket_lo") * 1000).alias("bucket_lo_ms"),
        (pl.col("bucket_hi") * 1000).alias("bucket_hi_ms"),
        pl.col("n").alias("n_server"),
    )
    out = ours.join(server, on="run_id", how="left")
    ours_ms, theirs = pl.col("client_ttft_p50_ms"), pl.col("server_ttft_p50_ms")
    gap = ours_ms - theirs
    # The histogram only knows the bucket its median fell in; inside it, interpolation is
    # a guess. Agreement: within 10 %, or 0-10 ms longer (HTTP and request parsing, which
    # vLLM's clock does not see), or inside the median's bucket widened by 10 %.
    agrees = (
        ((ours_ms / theirs - 1).abs() <= 0.1)
        | ((gap >= 0) & (gap <= 10))
        | ((ours_ms >= 0.9 * pl.col("bucket_lo_ms")) & (ours_ms <= 1.1 * pl.col("bucket_hi_ms")))
    )
    return out.with_columns((ours_ms / theirs).alias("ratio"), agrees.alias("agrees"))


def run_rates(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """Per run, seed 001's throughput columns and the offered load: TTFT p50/p95, the median request's decode
    rate (tokens after the first / time from first to last token) and total output
    tokens per second over the run (first send to last answer). Failed requests add no
    tokens but stay in the time span; never-sent ones are in neither."""
    sql = f"""
    WITH r AS (
        SELECT run_id, status, t_sent, t_done, output_tokens_received AS out,
               t_scheduled,
               {ttft_ms()} AS ttft_ms,
               CASE WHEN status = '{OK}' AND t_last_token > t_first_token
                    THEN (output_tokens_received - 1) / (t_last_token - t_first_token) END AS tok_s
        FROM requests
    )
    SELECT run_id,
           quantile_cont(ttft_ms, 0.5) AS ttft_p50_ms,
           quantile_cont(ttft_ms, 0.95) AS ttft_p95_ms,
           quantile_cont(tok_s, 0.5) AS tok_s_per_request,
           sum(out) FILTER (WHERE status = '{OK}') / nullif(max(t_done) - min(t_sent), 0) AS total_tok_s,
           -- open loop: the schedule's arrival rate (closed loop: the rate it achieved)
           any_value(o.offered_rps) AS offered_rps, any_value(o.arrival_span_s) AS arrival_span_s,
           count(*) FILTER (WHERE {FAILED}) AS n_failed
    FROM r LEFT JOIN ({OFFERED}) o USING (run_id) GROUP BY run_id
    """
    return query(con, sql)
