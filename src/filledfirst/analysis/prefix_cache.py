"""The prefix cache, measured two ways beside the ideal: per run and over its time.

- the ideal: what an unbounded cache would have served each request (the schedule's
  `ideal_cached_tokens`, filledfirst.trace.prefix);
- the answers: the cached prompt tokens vLLM reported on each request
  (`cached_tokens`), over the requests that reported it;
- the server: its counters of prompt tokens looked up and served (metrics.
  PREFIX_CACHE_QUERIES, PREFIX_CACHE_HITS), summed over engines.

A share is of prompt tokens. A failed request reports nothing: it is counted apart
(`n_unreported`), never folded into a share.
"""

from __future__ import annotations

import duckdb
import polars as pl

from filledfirst.analysis import signals
from filledfirst.engines.vllm import PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES
from filledfirst.metrics import sql_list

IDEAL, ANSWERS, SERVER = "ideal (unbounded cache)", "served (answers)", "served (server's counters)"

_COUNTERS = f"SELECT * FROM ({signals.SAMPLES}) WHERE metric IN ({sql_list(PREFIX_CACHE_QUERIES + PREFIX_CACHE_HITS)})"
_KIND = f"CASE WHEN metric IN ({sql_list(PREFIX_CACHE_HITS)}) THEN 'hits' ELSE 'queries' END"

# Per run: each counter's increase, summed over engines (the largest spelling, if a
# scraper stored two), and the answers' and the ideal's sums.
COUNTS = f"""
WITH per_name AS (
    SELECT run_id, metric, {_KIND} AS kind, sum(delta) AS n
    FROM ({signals.increase(_COUNTERS, "run_id, metric, labels")}) GROUP BY run_id, metric
),
server AS (
    SELECT run_id, max(n) FILTER (kind = 'hits') AS server_hit_tokens,
           max(n) FILTER (kind = 'queries') AS server_query_tokens
    FROM per_name GROUP BY run_id
),
answers AS (
    SELECT run_id,
           count(*) FILTER (WHERE ideal_cached_tokens IS NOT NULL) AS n_with_ideal,
           count(*) FILTER (WHERE t_sent IS NOT NULL AND cached_tokens IS NULL) AS n_unreported,
           sum(prompt_tokens) FILTER (WHERE cached_tokens IS NOT NULL)::DOUBLE AS prompt_tokens,
           sum(cached_tokens)::DOUBLE AS cached_tokens,
           sum(ideal_cached_tokens) FILTER (WHERE cached_tokens IS NOT NULL)::DOUBLE AS ideal_tokens
    FROM requests GROUP BY run_id
)
SELECT a.*, s.server_hit_tokens, s.server_query_tokens
FROM answers a LEFT JOIN server s USING (run_id)
"""


def counts(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """One row per run: COUNTS' columns, and the shares they make (NULL where unknown)."""
    def ratio(part: str, whole: str) -> pl.Expr:
        return pl.when(pl.col(whole) > 0).then(pl.col(part) / pl.col(whole))

    return signals.query(con, COUNTS).with_columns(
        ratio("ideal_tokens", "prompt_tokens").alias("ideal_share"),
        ratio("cached_tokens", "prompt_tokens").alias("answers_share"),
        ratio("server_hit_tokens", "server_query_tokens").alias("server_share"),
    )


_OVER_TIME = f"""
WITH r AS (
    SELECT * FROM requests WHERE run_id = $run AND cached_tokens IS NOT NULL AND ideal_cached_tokens IS NOT NULL
),
span AS (SELECT min(t_scheduled) AS t0, greatest(max(t_scheduled) - min(t_scheduled), 1e-9) AS length FROM r),
binned AS (
    SELECT least(floor((t_scheduled - t0) / length * $bins), $bins - 1) AS bin, prompt_tokens, cached_tokens,
           ideal_cached_tokens
    FROM r, span
),
per_bin AS (
    SELECT bin, sum(ideal_cached_tokens) / sum(prompt_tokens) AS ideal,
           sum(cached_tokens) / sum(prompt_tokens) AS answers, count(*) AS n
    FROM binned GROUP BY bin
),
c AS (  -- the counters' rise between scrapes, summed over engines, by scrape time
    SELECT t, {_KIND} AS kind, value - lag(value) OVER (PARTITION BY metric, labels ORDER BY t) AS d
    FROM ({_COUNTERS}) WHERE run_id = $run AND value IS NOT NULL
),
server AS (
    SELECT least(greatest(floor((t - t0) / length * $bins), 0), $bins - 1) AS bin,
           sum(d) FILTER (kind = 'hits' AND d >= 0) / nullif(sum(d) FILTER (kind = 'queries' AND d >= 0), 0) AS server
    FROM c, span WHERE d IS NOT NULL AND t >= t0 GROUP BY bin
)
SELECT (p.bin + 0.5) * length / $bins + t0 AS t, p.n, p.ideal, p.answers, s.server
FROM per_bin p LEFT JOIN server s USING (bin), span ORDER BY p.bin
"""


def over_time(con: duckdb.DuckDBPyConnection, run_id: str, bins: int = 20) -> pl.DataFrame:
    """Long format, by arrival time in `bins` equal stretches of the run: t (the stretch's
    middle), series (IDEAL, ANSWERS, SERVER), share; empty for a run whose schedule had
    no prefix blocks or whose server reported no cached tokens."""
    wide = signals.query(con, _OVER_TIME, {"run": run_id, "bins": bins})
    return wide.unpivot(index=["t", "n"], on=["ideal", "answers", "server"], variable_name="series",
                        value_name="share").with_columns(
        pl.col("series").replace_strict({"ideal": IDEAL, "answers": ANSWERS, "server": SERVER})).drop_nulls("share")
