"""The windowed SQL: per run, the scheduler's gauges over the loaded window
(filledfirst.analysis.diagnosis.window), the preemptions inside it, the requests that
arrived in it, the interference of long prefills, vLLM's queue share of TTFT, the engine
steps taken while requests waited, and every engine's cache settings; joined with the
whole-run summary into one row per run.

Shares and Little's L are time-weighted: a scrape's value holds until the next scrape
attempt, good or failed, and at most the window's `hold`, so a gap is not filled; medians
and maxima are over the scrapes inside the window; preemptions are the counter's increase
inside it. First crossings are over the whole run, on the run's clock.
"""

from __future__ import annotations

from typing import Any

import duckdb
import polars as pl

from filledfirst import request_metrics
from filledfirst.analysis import request_path, signals
from filledfirst.analysis.diagnosis.window import WINDOW_TABLE
from filledfirst.metrics import (
    CACHE_INFO,
    GENERATED,
    KV_USAGE,
    PREEMPTIONS,
    QUEUE_TIME_HISTOGRAMS,
    RUNNING,
    SCRAPE_ERROR,
    STEP_TOKENS,
    STEPS,
    WAITING,
    series_sql,
    sql_list,
)
from filledfirst.study import DiagnosisRules

# the whole-run columns of signals.run_summary the diagnosis reads
SUMMARY_COLUMNS = ("run_id", "experiment", "status", "error", "n_requests", "n_failed", "n_not_sent", "ttft_p50_ms",
                   "ttft_p90_ms", "ttft_timeouts", "lag_p99_ms", "max_num_seqs")

_GAUGE_WINDOW = f"""
WITH attempts AS (  -- every scrape, good or failed
    SELECT DISTINCT run_id, t FROM samples
    WHERE metric IN ({sql_list(RUNNING + WAITING + KV_USAGE + (SCRAPE_ERROR,))})
),
nxt AS (SELECT run_id, t, lead(t) OVER (PARTITION BY run_id ORDER BY t) AS t_next FROM attempts),
g AS (
    SELECT g.*, n.t_next, w.start, w.stop, w.at_cap, w.hold
    FROM ({signals.GAUGES}) g JOIN {WINDOW_TABLE} w USING (run_id) LEFT JOIN nxt n USING (run_id, t)
    WHERE g.t <= w.stop
),
seg AS (  -- a scrape's value stands until the next attempt, however it went, and at most `hold`
    SELECT *, greatest(t, start) AS a, least(coalesce(t_next, stop), t + hold, stop) AS b
    FROM g
),
tw AS (
    SELECT run_id,
           sum(b - a) FILTER (signal = 'running') AS t_run,
           sum(b - a) FILTER (signal = 'running' AND value >= at_cap) AS t_cap,
           sum(b - a) FILTER (signal = 'waiting') AS t_wait,
           sum(b - a) FILTER (signal = 'waiting' AND value > 0) AS t_waiting,
           sum(b - a) FILTER (signal = 'kv_pct') AS t_kv,
           sum(b - a) FILTER (signal = 'kv_pct' AND value >= $kv_full) AS t_kv_full,
           sum((b - a) * value) FILTER (signal IN ('running', 'waiting')) AS area
    FROM seg WHERE b > a AND value IS NOT NULL GROUP BY run_id  -- an unknown value stands for no time
),
inside AS (
    SELECT run_id,
           quantile_cont(value, 0.5) FILTER (signal = 'running') AS window_running_median,
           max(value) FILTER (signal = 'running') AS window_running_max,
           count(value) FILTER (signal = 'running') AS window_scrapes,
           quantile_cont(value, 0.5) FILTER (signal = 'waiting') AS window_waiting_median,
           quantile_cont(value, 0.5) FILTER (signal = 'kv_pct') AS window_kv_median_pct,
           max(value) FILTER (signal = 'kv_pct') AS window_kv_max_pct
    FROM g WHERE t >= start GROUP BY run_id
),
span AS (SELECT run_id, any_value(stop) - any_value(start) AS length FROM g GROUP BY run_id),
first AS (  -- over the whole run, on the run's clock
    SELECT g.run_id,
           min(t) FILTER (signal = 'waiting' AND value > 0) AS t_first_waiting,
           min(t) FILTER (signal = 'running' AND value >= at_cap) AS t_first_cap,
           min(t) FILTER (signal = 'kv_pct' AND value >= $kv_full) AS t_first_kv
    FROM ({signals.GAUGES}) g JOIN {WINDOW_TABLE} w USING (run_id) GROUP BY g.run_id
)
SELECT run_id, coalesce(t_cap, 0) / t_run AS running_at_cap_share,
       coalesce(t_waiting, 0) / t_wait AS waiting_share, coalesce(t_kv_full, 0) / t_kv AS kv_full_share,
       area / t_run AS littles_L_server, t_run / nullif(span.length, 0) AS scrape_coverage,
       inside.* EXCLUDE (run_id), first.* EXCLUDE (run_id)
FROM tw FULL JOIN inside USING (run_id) FULL JOIN first USING (run_id) LEFT JOIN span USING (run_id)
"""

# The counter's increase inside the window: from its last scrape at or before the window's
# start (its first scrape if none) to its last one inside.
_PREEMPTIONS = signals.preemptions_sql(f"""
    SELECT * FROM (
        SELECT s.*, max(s.t) FILTER (WHERE s.t <= w.start) OVER (PARTITION BY s.run_id, s.metric, s.labels) AS anchor
        FROM ({signals.SAMPLES}) s JOIN {WINDOW_TABLE} w USING (run_id)
        WHERE s.metric IN ({sql_list(PREEMPTIONS)}) AND s.t <= w.stop
    ) WHERE anchor IS NULL OR t >= anchor""")

# A counter that goes down between two scrapes of one series: the server restarted, or the
# scrapes read different servers (a load balancer in front of several).
_COUNTER_DROPS = f"""
SELECT run_id, count(*) FILTER (WHERE value < before) AS counter_drops FROM (
    SELECT run_id, value, lag(value) OVER (PARTITION BY run_id, metric, labels ORDER BY t) AS before
    FROM ({signals.SAMPLES}) WHERE {series_sql(GENERATED)})
GROUP BY run_id"""

_REQUESTS = f"""
WITH r AS (
    SELECT r.*, w.start, w.stop, i.max_gap_ms, {request_metrics.ttft_ms('r')} AS ttft
    FROM requests r JOIN {WINDOW_TABLE} w USING (run_id)
    LEFT JOIN ({request_metrics.REQUEST_STALL}) i USING (run_id, request_id)
)
SELECT run_id,
       count(*) FILTER (WHERE t_scheduled BETWEEN start AND stop AND t_sent IS NOT NULL) AS arrivals,
       -- every request's time in the system inside the window (from its arrival, as W
       -- is; one never answered stays until the window's end; one never sent never arrived)
       sum(greatest(least(coalesce(t_done, stop), stop) - greatest(t_scheduled, start), 0))
           FILTER (WHERE t_sent IS NOT NULL) / (any_value(stop) - any_value(start)) AS lambda_w,
       count(*) FILTER (WHERE {request_metrics.slo_met("ttft")}) AS met,
       -- the answered requests arriving in the window (a ramp's first requests arrive together)
       count(*) FILTER (WHERE t_scheduled BETWEEN start AND stop AND ttft IS NOT NULL) AS window_answered,
       count(*) FILTER (WHERE t_scheduled BETWEEN start AND stop AND {request_metrics.slo_met("ttft")})
           AS window_met,
       count(*) FILTER (WHERE t_scheduled BETWEEN start AND stop AND ttft > $slo_ttft) AS ttft_over,
       any_value(o.n_sent) AS n, any_value(o.offered_rps) AS offered_rps,
       avg(prompt_tokens + output_tokens) AS mean_tokens,
       -- the prefix cache, over the answered requests arriving in the window that say
       -- what it served them, beside what an unbounded cache would have
       sum(prompt_tokens) FILTER (WHERE t_scheduled BETWEEN start AND stop AND cached_tokens IS NOT NULL)
           AS cache_prompt_tokens,
       sum(cached_tokens) FILTER (WHERE t_scheduled BETWEEN start AND stop) AS cache_hit_tokens,
       sum(ideal_cached_tokens) FILTER (WHERE t_scheduled BETWEEN start AND stop AND cached_tokens IS NOT NULL)
           AS cache_ideal_tokens
FROM r LEFT JOIN ({signals.OFFERED}) o USING (run_id) GROUP BY run_id
"""

# vLLM's queue over the TTFT of the requests that arrived in the loaded window.
_QUEUE_SHARE = request_path.queue_share_sql(f"""
    SELECT p.* FROM ({request_path.REQUEST_PARTS}) p JOIN {WINDOW_TABLE} w USING (run_id)
    WHERE p.t_scheduled BETWEEN w.start AND w.stop""")

_INTERFERENCE = f"""
WITH med AS (SELECT run_id, median(prompt_tokens) * $factor AS long_from FROM requests GROUP BY run_id),
r AS (
    SELECT r.*, m.long_from FROM ({request_path.REQUEST_PARTS}) r JOIN med m USING (run_id)
    WHERE r.t_sent IS NOT NULL
),
prefill AS (  -- a long prompt's prefill, to its first token: from when vLLM scheduled it if
              -- the server said, else from its send (any queue wait of its own included)
    SELECT run_id, CASE WHEN timed THEN t_prefill_start ELSE t_sent END AS t_start,
           coalesce(t_first_token, t_done) AS t_end
    FROM r WHERE prompt_tokens >= long_from
),
state AS (  -- the scheduler at each scrape, and whether a full server explains its queue
    SELECT g.run_id, g.t,
           bool_or(signal = 'waiting' AND value > 0)
           AND bool_or((signal = 'running' AND value >= w.at_cap) OR (signal = 'kv_pct' AND value >= $kv_full))
               AS limit_queue
    FROM ({signals.GAUGES}) g JOIN {WINDOW_TABLE} w USING (run_id) GROUP BY g.run_id, g.t
),
short AS (
    SELECT o.*, coalesce(s.limit_queue, false) AS limit_queue
    FROM r o ASOF LEFT JOIN state s ON o.run_id = s.run_id AND o.t_scheduled >= s.t
    WHERE o.prompt_tokens < o.long_from
),
other AS (  -- one that arrived into a queue of the cap or of full KV is no evidence either way
    SELECT o.run_id, o.ttft_ms AS ttft, o.timed,
           -- TTFT from send outside vLLM's queue: its prefill, and the front end, which holds
           -- the wait for the engine step under way (vLLM's queue clock starts after it):
           -- behind a long prefill's step, that wait is the interference itself
           o.front_end_ms + o.prefill_ms AS unqueued,
           EXISTS (SELECT 1 FROM prefill p WHERE p.run_id = o.run_id
                   AND o.t_scheduled BETWEEN p.t_start AND p.t_end) AS during
    FROM short o WHERE NOT o.limit_queue
)
SELECT run_id, count(*) FILTER (WHERE during) AS n_during, count(*) FILTER (WHERE NOT during) AS n_apart,
       quantile_cont(ttft, 0.9) FILTER (WHERE during) / quantile_cont(ttft, 0.9) FILTER (WHERE NOT during)
           AS interference_ratio,
       count(*) FILTER (WHERE during AND timed) AS n_during_timed,
       quantile_cont(unqueued, 0.9) FILTER (WHERE during AND timed)
           / quantile_cont(unqueued, 0.9) FILTER (WHERE NOT during AND timed) AS interference_prefill_ratio
FROM other GROUP BY run_id
"""

# The engine steps while requests waited, and the tokens they processed: the step
# histogram's count and sum over the intervals between scrapes that end in the window and
# that a scrape which saw requests waiting opened (the steps that followed a queue: the
# interval that closes at its first sight holds the steps before it formed).
_BUDGET_STEPS = f"""
WITH c AS (  -- per scrape and engine: steps and their tokens so far
    SELECT s.run_id, s.labels AS series, s.t, any_value(w.start) AS start,
           max(s.value) FILTER (s.metric IN ({sql_list(STEPS)})) AS steps,
           max(s.value) FILTER (s.metric IN ({sql_list(STEP_TOKENS)})) AS tokens
    FROM ({signals.SAMPLES}) s JOIN {WINDOW_TABLE} w USING (run_id)
    WHERE s.metric IN ({sql_list(STEPS + STEP_TOKENS)})
      AND w.budget IS NOT NULL AND s.t <= w.stop
    GROUP BY s.run_id, s.labels, s.t
),
d AS (
    SELECT *, lag(t) OVER s AS t_prev, greatest(steps - lag(steps) OVER s, 0) AS d_steps,
           greatest(tokens - lag(tokens) OVER s, 0) AS d_tokens
    FROM c WINDOW s AS (PARTITION BY run_id, series ORDER BY t)
),
waiting AS (SELECT run_id, t, value > 0 AS queued FROM ({signals.GAUGES}) WHERE signal = 'waiting')
SELECT d.run_id, coalesce(sum(d_steps) FILTER (p.queued), 0) AS queued_steps,
       coalesce(sum(d_tokens) FILTER (p.queued), 0) AS queued_tokens
FROM d LEFT JOIN waiting p ON p.run_id = d.run_id AND p.t = d.t_prev
WHERE d.t_prev IS NOT NULL AND d.t > d.start
GROUP BY d.run_id
"""

# Which engine's names a run's samples carry (filledfirst.engines: each its own prefix),
# read off its running gauge, which every engine has.
_ENGINE = f"""
SELECT run_id, min(split_part(metric, ':', 1) || ':') AS engine_prefix
FROM samples WHERE metric IN ({sql_list(RUNNING)}) GROUP BY run_id
"""

# Every engine's cache settings at the last scrape that had them.
_CACHE_INFO = f"""
WITH c AS (SELECT * FROM samples WHERE metric IN ({sql_list(CACHE_INFO)})),
last AS (SELECT run_id, max(t) AS t FROM c GROUP BY run_id)
SELECT run_id, list(DISTINCT labels ORDER BY labels) AS cache_labels FROM c JOIN last USING (run_id, t) GROUP BY run_id
"""



def measure(con: duckdb.DuckDBPyConnection, summary: pl.DataFrame, window: pl.DataFrame,
            rules: DiagnosisRules) -> list[dict[str, Any]]:
    """One row per run of `summary`: its columns, the window's and every windowed query's
    (NULL where a query has no row for the run)."""
    con.register(WINDOW_TABLE, window.to_arrow())
    try:
        parts = [
            signals.query(con, _GAUGE_WINDOW, {"kv_full": rules.kv_full_pct}),
            signals.query(con, _PREEMPTIONS).rename({"preemptions": "window_preemptions"}),
            signals.query(con, _REQUESTS, {"slo_ttft": rules.slo_ttft_ms, "slo_itl": rules.slo_itl_ms}),
            signals.query(con, _INTERFERENCE, {"factor": rules.long_prompt_factor, "kv_full": rules.kv_full_pct}),
            signals.query(con, _QUEUE_SHARE).select(
                "run_id", pl.col("queue_share").alias("window_queue_share"), pl.col("n_timed").alias("window_timed")),
            signals.query(con, _CACHE_INFO),
            signals.query(con, _ENGINE),
            signals.query(con, _BUDGET_STEPS),
            signals.histogram_quantile(con, QUEUE_TIME_HISTOGRAMS, 0.5).select(
                "run_id", (pl.col("value") * 1000).alias("queue_time_p50_ms")),
            signals.query(con, signals.CLIENT).drop("client_cpu_s"),
            signals.query(con, _COUNTER_DROPS),
        ]
    finally:
        con.unregister(WINDOW_TABLE)
    table = summary.join(window, on="run_id", how="left")
    for part in parts:
        table = table.join(part, on="run_id", how="left")
    return table.to_dicts()
