"""The request path, measured: where each request's TTFT went, from the client's own times
and the server's per-request timings (filledfirst.metrics.PER_REQUEST), defined once.

Per request that succeeded (ms; NULL where the server reported no timings):
- dispatch lag = t_sent - t_scheduled: how late our client sent it;
- front end and transport = TTFT from send - server queue - server prefill: HTTP both
  ways, the API server (parsing, tokenizing, detokenizing), the hand-over to the engine
  core, and the wait for the engine step under way when it arrived: vLLM stamps a request
  queued only when the engine core's loop takes it in, between two steps;
- server queue = vLLM's queue_time_ms: queued to first scheduled;
- server prefill = vLLM's time_to_first_token_ms: scheduled to the first token (a
  preemption before it counts here, vLLM keeps the first scheduling);
- decode = vLLM's generation_time_ms: first token to last.
The first four add up to TTFT (request_metrics.ttft_ms, from the scheduled arrival) exactly: the
front end is what is left. The server's durations are on its clock, ours on ours; only
durations are compared, never instants, except that a request's prefill interval is placed
on our clock by its first token (`t_prefill_start`), which reaches us a transport later
than vLLM stamped it: milliseconds against the prefills it is used for.
"""

from __future__ import annotations

import duckdb
import polars as pl

from filledfirst import request_metrics
from filledfirst.analysis import signals

# (column, name) in path order; decode comes after the first token and is not part of TTFT.
TTFT_PARTS = (
    ("dispatch_ms", "dispatch lag"),
    ("front_end_ms", "front end and transport"),
    ("queue_ms", "server queue"),
    ("prefill_ms", "server prefill"),
)
QUANTILES = (0.5, 0.9)
# The parts "at p50" are the mean parts of the requests whose TTFT ranks within this many
# quantile points of the p50 (at least the nearest one): parts that add up to a TTFT, which
# each part's own p50 would not.
BAND = 0.05

_OK = f"status = '{request_metrics.OK}'"

# Every requests column, and the parts.
REQUEST_PARTS = f"""
SELECT *,
       {request_metrics.ttft_ms()} AS ttft_ms,
       CASE WHEN {_OK} THEN (t_sent - t_scheduled) * 1000 END AS dispatch_ms,
       {request_metrics.ok_ms("t_first_token", "t_sent")} - server_queue_ms - server_prefill_ms AS front_end_ms,
       CASE WHEN {_OK} THEN server_queue_ms END AS queue_ms,
       CASE WHEN {_OK} THEN server_prefill_ms END AS prefill_ms,
       CASE WHEN {_OK} THEN server_decode_ms END AS decode_ms,
       -- the server reported the timings TTFT splits by
       coalesce({_OK} AND t_first_token IS NOT NULL AND server_queue_ms IS NOT NULL
                AND server_prefill_ms IS NOT NULL, false) AS timed,
       -- when the server scheduled it, on our clock (see the module's docstring)
       t_first_token - server_prefill_ms / 1000 AS t_prefill_start
FROM requests
"""


def queue_share_sql(source: str = REQUEST_PARTS) -> str:
    """Per run: how much of the TTFT of the requests in `source` (REQUEST_PARTS rows, maybe
    fewer) was the server's queue, summed over those with timings (time-weighted: a long
    wait weighs as long as it was); with how many succeeded and how many had timings."""
    return f"""
    SELECT run_id, count(ttft_ms) AS n_ok, count(*) FILTER (WHERE timed) AS n_timed,
           sum(queue_ms) FILTER (WHERE timed) / nullif(sum(ttft_ms) FILTER (WHERE timed), 0) AS queue_share
    FROM ({source}) GROUP BY run_id"""


def queue_shares(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """Per run, over the whole run: queue_share (NULL without timings), n_ok, n_timed."""
    return signals.query(con, queue_share_sql())


def ttft_parts(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    """Per role of the run and quantile (QUANTILES): the mean parts (TTFT_PARTS) of the
    requests around that TTFT quantile (BAND), their mean TTFT (the parts' sum) and the
    quantile itself, over the requests with timings; n_ok and n_timed say how many there
    were. A role without timings has one row per quantile with NULL parts."""
    parts = ", ".join(f"avg({col}) FILTER (WHERE dist <= greatest({BAND}, nearest)) AS {col}"
                      for col, _ in TTFT_PARTS)
    band_parts = ", ".join(f"band.{col}" for col, _ in TTFT_PARTS)
    qs = f"{list(QUANTILES)}::DOUBLE[]"
    sql = f"""
    WITH p AS (SELECT * FROM ({REQUEST_PARTS}) WHERE run_id = $run AND ttft_ms IS NOT NULL),
    q AS (SELECT unnest({qs}) AS q),
    ranked AS (
        SELECT *, percent_rank() OVER (PARTITION BY role ORDER BY ttft_ms) AS pr FROM p WHERE timed
    ),
    near AS (
        SELECT r.*, q.q, abs(r.pr - q.q) AS dist, min(abs(r.pr - q.q)) OVER (PARTITION BY r.role, q.q) AS nearest
        FROM ranked r CROSS JOIN q
    ),
    band AS (
        SELECT role, q, {parts},
               avg(ttft_ms) FILTER (WHERE dist <= greatest({BAND}, nearest)) AS ttft_ms,
               count(*) FILTER (WHERE dist <= greatest({BAND}, nearest)) AS n_band
        FROM near GROUP BY role, q
    ),
    roles AS (
        SELECT role, min(t_scheduled) AS first, count(*) AS n_ok, count(*) FILTER (WHERE timed) AS n_timed,
               quantile_cont(ttft_ms, {qs}) FILTER (WHERE timed) AS ttft_qs
        FROM p GROUP BY role
    )
    SELECT $run AS run_id, roles.role, q.q, roles.n_ok, roles.n_timed, coalesce(band.n_band, 0) AS n_band,
           roles.ttft_qs[list_position({qs}, q.q)] AS ttft_q_ms, band.ttft_ms, {band_parts}
    FROM roles CROSS JOIN q LEFT JOIN band USING (role, q)
    ORDER BY roles.first, roles.role, q.q
    """
    return signals.query(con, sql, {"run": run_id})


def against_server(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """The per-request form of signals.ttft_against_server: for each request, our TTFT from
    send against the server's queue + prefill of the same request; the difference is the
    front end and transport, as a distribution per run. n_server_longer counts requests
    whose server part exceeded our whole TTFT from send: impossible with both clocks right."""
    sql = f"""
    SELECT run_id, count(ttft_ms) AS n_ok, count(*) FILTER (WHERE timed) AS n_timed,
           {", ".join(f"quantile_cont(front_end_ms, {q}) FILTER (WHERE timed) AS front_end_p{round(q * 100)}_ms"
                      for q in (0.5, 0.9, 0.99))},
           max(front_end_ms) FILTER (WHERE timed) AS front_end_max_ms,
           count(*) FILTER (WHERE timed AND front_end_ms < 0) AS n_server_longer,
           -- per request, the server's share of our TTFT from send; its median over the run
           quantile_cont((queue_ms + prefill_ms) / nullif(front_end_ms + queue_ms + prefill_ms, 0), 0.5)
               FILTER (WHERE timed) AS server_share_p50
    FROM ({REQUEST_PARTS}) GROUP BY run_id ORDER BY run_id
    """
    return signals.query(con, sql)
