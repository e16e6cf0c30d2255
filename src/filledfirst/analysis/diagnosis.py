"""What filled first: one label per run, from the stored signals only.

Every number comes from the DuckDB tables (through `signals` where it defines one); the
rules are the seed's patterns table made explicit, with thresholds in `DiagnosisRules`.
Scheduler signals are judged over the *loaded window*: from the first arrival of a sent
request plus `warmup_frac` of the sent requests' arrival span (the server still filling)
to their last arrival (after it the queue only drains, which would make any overload look
like a long tail of waiting), cut at the last scrape. Shares and Little's L are
time-weighted: a scrape's value holds until the next scrape attempt, good or failed, and
at most `scrape_hold_factor` x the scrape interval, so a gap is not filled; medians and
maxima are over the scrapes inside the window; preemptions are the counter's increase
inside it. Every column measured over the window is named `window_*` (or is a share of
it), so it is never confused with `signals.run_summary`'s whole-run column of the same
signal (`window_running_max` against `running_max`). TTFT, dispatch lag and vLLM's queue
time keep their whole-run definitions from `signals`, first crossings are on the run's
clock.

Where the server reported per-request timings (filledfirst.analysis.request_path), the
limits and the interference are also judged by where the requests' TTFT went: the two
limits need vLLM's queue to dominate the TTFT of the requests arriving in the loaded
window, interference needs the affected requests' TTFT outside that queue to be inflated,
with the long prompts' prefill taken from vLLM's own interval. Without them the gauge rules
stand alone; the clue says which evidence was used.

Columns beyond the ones the report reads: `notes` (what could not be checked and why),
`cap` (the max_num_seqs used, per engine), `engines`, `window_scrapes`,
`window_running_median`, `window_running_max`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict
from pathlib import Path
from typing import Mapping

import duckdb
import polars as pl

from filledfirst import request_metrics
from filledfirst.analysis import request_path, signals
from filledfirst.contracts import runmeta
from filledfirst.contracts.runmeta import RunMeta
from filledfirst.errors import UserError
from filledfirst.metrics import (
    CACHE_CONFIG_INFO,
    KV_USAGE,
    PREEMPTIONS,
    QUEUE_TIME_HISTOGRAM,
    RUNNING,
    SCRAPE_ERROR,
    WAITING,
    sql_list,
)
from filledfirst.study import DiagnosisRules  # the thresholds: the config's `diagnosis` section

__all__ = ["DiagnosisRules", "diagnose", "stored_rules", "write_diagnosis"]


LABELS = ("failed", "prefill-decode interference", "KV-capacity pressure", "active-sequence limit",
          "reference", "unclassified")

SCHEMA = {
    "run_id": pl.String, "experiment": pl.String, "expect": pl.String, "label": pl.String,
    "clue": pl.String, "warnings": pl.String, "notes": pl.String, "cap": pl.Int64, "engines": pl.Int64,
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
    # from the server's per-request timings (NULL without): vLLM's queue over the TTFT of the
    # requests arriving in the window, how many had timings, and the interference ratio of
    # the TTFT outside that queue
    "window_queue_share": pl.Float64, "window_timed": pl.Int64, "interference_prefill_ratio": pl.Float64,
    # did the client keep up (signals.CLIENT): its CPU over the replay, per 1,000 tokens,
    # and the rate it sent at over the one it was asked for (open loop)
    "client_cpu_share": pl.Float64, "client_cpu_ms_per_1k_tokens": pl.Float64, "arrival_ratio": pl.Float64,
}

# per run: start, stop, at_cap (running count that counts as at the cap), hold (how long
# a scrape's value stands for)
_WIN = "_diagnosis_window"

_GAUGE_WINDOW = f"""
WITH attempts AS (  -- every scrape, good or failed
    SELECT DISTINCT run_id, t FROM samples
    WHERE metric IN ({sql_list(RUNNING + WAITING + KV_USAGE + (SCRAPE_ERROR,))})
),
nxt AS (SELECT run_id, t, lead(t) OVER (PARTITION BY run_id ORDER BY t) AS t_next FROM attempts),
g AS (
    SELECT g.*, n.t_next, w.start, w.stop, w.at_cap, w.hold FROM ({signals.GAUGES}) g JOIN {_WIN} w USING (run_id)
    LEFT JOIN nxt n USING (run_id, t)
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
    FROM ({signals.GAUGES}) g JOIN {_WIN} w USING (run_id) GROUP BY g.run_id
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
        FROM ({signals.SAMPLES}) s JOIN {_WIN} w USING (run_id)
        WHERE s.metric IN ({sql_list(PREEMPTIONS)}) AND s.t <= w.stop
    ) WHERE anchor IS NULL OR t >= anchor""")

_REQUESTS = f"""
WITH r AS (
    SELECT r.*, w.start, w.stop, i.max_gap_ms, {request_metrics.ttft_ms('r')} AS ttft
    FROM requests r JOIN {_WIN} w USING (run_id)
    LEFT JOIN ({request_metrics.REQUEST_STALL}) i USING (run_id, request_id)
)
SELECT run_id,
       count(*) FILTER (WHERE t_scheduled BETWEEN start AND stop AND t_sent IS NOT NULL) AS arrivals,
       -- every request's time in the system inside the window (from its arrival, as W
       -- is; one never answered stays until the window's end; one never sent never arrived)
       sum(greatest(least(coalesce(t_done, stop), stop) - greatest(t_scheduled, start), 0))
           FILTER (WHERE t_sent IS NOT NULL) / (any_value(stop) - any_value(start)) AS lambda_w,
       count(*) FILTER (WHERE {request_metrics.slo_met("ttft")}) AS met,
       any_value(o.n_sent) AS n, any_value(o.offered_rps) AS offered_rps,
       avg(prompt_tokens + output_tokens) AS mean_tokens
FROM r LEFT JOIN ({signals.OFFERED}) o USING (run_id) GROUP BY run_id
"""

# vLLM's queue over the TTFT of the requests that arrived in the loaded window.
_QUEUE_SHARE = request_path.queue_share_sql(f"""
    SELECT p.* FROM ({request_path.REQUEST_PARTS}) p JOIN {_WIN} w USING (run_id)
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
    FROM ({signals.GAUGES}) g JOIN {_WIN} w USING (run_id) GROUP BY g.run_id, g.t
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

# Every engine's cache settings at the last scrape that had them.
_CACHE_INFO = f"""
WITH c AS (SELECT * FROM samples WHERE metric = '{CACHE_CONFIG_INFO}'),
last AS (SELECT run_id, max(t) AS t FROM c GROUP BY run_id)
SELECT run_id, list(DISTINCT labels ORDER BY labels) AS cache_labels FROM c JOIN last USING (run_id, t) GROUP BY run_id
"""


def diagnose(con: duckdb.DuckDBPyConnection, rules: DiagnosisRules,
             expect: Mapping[str, str] | None = None) -> pl.DataFrame:
    """One row per run. `expect`: experiment -> designed-for label, for runs whose
    run.json does not carry `spec.expect` (e.g. from the config the CLI was given)."""
    summary = signals.run_summary(con).select(
        "run_id", "experiment", "status", "error", "n_requests", "n_failed", "n_not_sent", "ttft_p50_ms", "ttft_p90_ms",
        "ttft_timeouts",
        "lag_p99_ms", "max_num_seqs")
    metas = signals.run_metas(con)
    window = _windows(con, summary, metas, rules)
    con.register(_WIN, window.to_arrow())
    try:
        parts = [
            signals.query(con, _GAUGE_WINDOW, {"kv_full": rules.kv_full_pct}),
            signals.query(con, _PREEMPTIONS).rename({"preemptions": "window_preemptions"}),
            signals.query(con, _REQUESTS, {"slo_ttft": rules.slo_ttft_ms, "slo_itl": rules.slo_itl_ms}),
            signals.query(con, _INTERFERENCE, {"factor": rules.long_prompt_factor, "kv_full": rules.kv_full_pct}),
            signals.query(con, _QUEUE_SHARE).select(
                "run_id", pl.col("queue_share").alias("window_queue_share"), pl.col("n_timed").alias("window_timed")),
            signals.query(con, _CACHE_INFO),
            signals.histogram_quantile(con, QUEUE_TIME_HISTOGRAM, 0.5).select(
                "run_id", (pl.col("value") * 1000).alias("queue_time_p50_ms")),
            signals.query(con, signals.CLIENT).drop("client_cpu_s"),
        ]
    finally:
        con.unregister(_WIN)
    table = summary.join(window, on="run_id", how="left")
    for part in parts:
        table = table.join(part, on="run_id", how="left")
    rows = [_finish(row, metas.get(row["run_id"]) or runmeta.unknown(row["run_id"]), rules, expect or {})
            for row in table.to_dicts()]
    return pl.DataFrame(rows, schema=SCHEMA)


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
    SELECT run_id, count(DISTINCT regexp_extract(labels, '(^|,)engine=([^,]*)', 2)) AS engines
    FROM running GROUP BY run_id
),
s AS (  -- the interval as scraped, for runs whose run.json does not say it
    SELECT run_id, max(t) AS scraped, median(dt) AS interval
    FROM (SELECT *, t - lag(t) OVER (PARTITION BY run_id ORDER BY t) AS dt FROM scrapes) GROUP BY run_id
)
SELECT r.*, s.scraped, s.interval, e.engines FROM r LEFT JOIN s USING (run_id) LEFT JOIN engines e USING (run_id)
"""


def _windows(con, summary: pl.DataFrame, metas: Mapping[str, RunMeta], rules: DiagnosisRules) -> pl.DataFrame:
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
                     "hold": rules.scrape_hold_factor * interval if interval else math.inf})
    schema = {"run_id": pl.String, "start": pl.Float64, "stop": pl.Float64, "cap": pl.Int64, "engines": pl.Int64,
              "at_cap": pl.Float64,
              "hold": pl.Float64}
    return pl.DataFrame(rows, schema=schema)


def _cap(db_cap: int | None, meta: RunMeta, rules: DiagnosisRules) -> int | None:
    # runs.max_num_seqs is the server's setting as the runner recorded it; an external
    # replay records none, so the spec's or the rules' value stands in.
    for value in (db_cap, meta.max_num_seqs, rules.default_cap):
        if value is not None:
            return int(value)
    return None


def _finish(row: dict, meta: RunMeta, r: DiagnosisRules, expect: Mapping[str, str]) -> dict:
    notes: list[str] = []
    n = row["n_requests"] - row["n_not_sent"]  # what the server saw
    out = {k: row.get(k) for k in SCHEMA}
    out.update(
        expect=meta.expect or expect.get(row["experiment"]),
        window_start_s=row["start"], window_end_s=row["stop"],
        failed_share=row["n_failed"] / n if n else None,
        first_crossings=_crossings(row, r) if n else None,
        interference_ratio=row["interference_ratio"] if _enough_during(row, r) else None,
        interference_prefill_ratio=(row["interference_prefill_ratio"]
                                    if _enough_during(row, r, row.get("n_during_timed")) else None),
        window_timed=row.get("window_timed") or 0,
    )
    out.update(_littles(row, meta, r, notes))
    out.update(_goodput(row))
    out.update(_kv_ledger(row, meta, notes))
    if row["cap"] is None:
        out["running_at_cap_share"] = None
        notes.append("max_num_seqs unknown: no at-cap signal")
    out["label"], out["clue"] = _label(out, row, r)
    out["warnings"] = "; ".join(_warnings(out, row, r))
    out["notes"] = "; ".join(notes)
    return out


def _enough_during(row: dict, r: DiagnosisRules, timed: int | None = None) -> bool:
    """One slow request behind one long prompt is an anecdote, not a pattern. `timed`: how
    many of those requests had server timings, when that is what counts."""
    during, apart = row.get("n_during") or 0, row.get("n_apart") or 0
    return (apart > 0 and during >= r.interference_min_requests
            and during >= r.interference_min_share * (during + apart)
            and (timed is None or timed >= r.interference_min_requests))


def _crossings(row: dict, r: DiagnosisRules) -> str:
    """When each limit was first touched, on the run's clock (whole run, not the window)."""
    if row.get("window_running_median") is None and row.get("t_first_waiting") is None:
        return "no scheduler samples"
    events = [("waiting>0", row.get("t_first_waiting")),
              ("running at cap", row.get("t_first_cap") if row["cap"] is not None else "unknown"),
              (f"KV>={r.kv_full_pct:g} %", row.get("t_first_kv"))]
    seen = sorted((t, name) for name, t in events if isinstance(t, float))
    rest = [f"{name} never" if t is None else "cap unknown" for name, t in events if not isinstance(t, float)]
    return "; ".join(x for x in (", ".join(f"{name} at {t:.1f} s" for t, name in seen), ", ".join(rest)) if x)


def _littles(row: dict, meta: RunMeta, r: DiagnosisRules, notes: list[str]) -> dict:
    """L (what the server holds, running + waiting, time-averaged) against lambda W from the
    client's records: a check that the gauges and the records describe the same requests.
    lambda W is taken in its sample-path form, the time-average of the requests in flight
    = (requests present in the window / its length) x (their mean time inside it): exact
    for any window, where arrivals-in-window x mean sojourn assumes a steady state that
    requests outlasting the window (the decoders of the interference runs) break."""
    arrivals, lambda_w, big_l = row.get("arrivals") or 0, row.get("lambda_w"), row.get("littles_L_server")
    skip = ("closed loop" if meta.closed_loop
            else f"{arrivals} arrivals in the window" if arrivals < r.littles_min_arrivals
            else "no scheduler samples" if big_l is None or not lambda_w else None)
    if skip:
        notes.append(f"Little's law not checked: {skip}")
        return {"littles_L_server": None, "littles_lambda_W": None, "littles_ratio": None, "littles_ok": True}
    ratio = big_l / lambda_w
    return {"littles_L_server": big_l, "littles_lambda_W": lambda_w, "littles_ratio": ratio,
            "littles_ok": r.littles_min_ratio <= ratio <= r.littles_max_ratio}


def _goodput(row: dict) -> dict:
    """The offered load (signals.OFFERED) times the share of sent requests that met the SLO."""
    met, n, offered = row.get("met"), row.get("n"), row.get("offered_rps")
    share = met / n if met is not None and n else None
    return {"goodput_rps": offered * share if share is not None and offered is not None else None,
            "slo_met_share": share}


def _label_value(labels: str | None, key: str) -> str | None:
    m = re.search(rf"(?:^|,){key}=([^,]*)", labels or "")
    return m.group(1) if m else None


def _label_int(labels: str, key: str) -> int | None:
    value = _label_value(labels, key)
    return int(value) if value is not None and value.isdigit() else None


def _engine_tokens(labels: str) -> int | None:
    tokens = _label_int(labels, "kv_cache_size_tokens")
    blocks, block_size = _label_int(labels, "num_gpu_blocks"), _label_int(labels, "block_size")
    return tokens if tokens is not None else blocks * block_size if blocks is not None and block_size else None


def _kv_ledger(row: dict, meta: RunMeta, notes: list[str]) -> dict:
    """Seed 004's ledger. What the engines report comes first (capacity in tokens, and bytes
    per token as their KV memory over those tokens); else bytes per token from the model's
    shape run.json recorded (filledfirst.model.kv). NULL, with the reason in the notes,
    where it is not known: never a wrong number."""
    engines = row.get("cache_labels") or []
    tokens = [_engine_tokens(labels) for labels in engines]
    memory = [_label_int(labels, "kv_cache_memory_bytes") for labels in engines]
    capacity = float(sum(tokens)) if engines and None not in tokens else None  # type: ignore[arg-type]
    per_token: float | None
    if capacity and None not in memory:
        per_token = sum(memory) / capacity  # type: ignore[arg-type]
    else:
        cache_dtypes = {_label_value(labels, "cache_dtype") for labels in engines} - {None}
        per_token, why = _kv_bytes_per_token(meta, next(iter(cache_dtypes)) if len(cache_dtypes) == 1 else None)
        if per_token is None and row["n_requests"]:
            notes.append(f"KV bytes per token not known ({why})")
    mean_tokens = row.get("mean_tokens")
    return {"kv_bytes_per_token": per_token, "kv_capacity_tokens": capacity,
            "kv_fit_concurrency": capacity / mean_tokens if capacity and mean_tokens else None}


def _kv_bytes_per_token(meta: RunMeta, cache_dtype: str | None) -> tuple[float | None, str]:
    """Bytes per token from the model's KV shape the run recorded when it started."""
    from filledfirst.model.kv import kv_bytes_per_token

    if meta.kv is None:
        return None, "the run recorded no KV shape (made by an older version)"
    return kv_bytes_per_token(meta.kv.elements_per_token, meta.kv.why, meta.kv.config_dtype, meta.model.dtype,
                              cache_dtype)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.0f} %"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}" if abs(x) < 10 else f"{x:.0f}"


def _count(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def _of(cap: int | None, engines: int = 1) -> str:
    return "" if cap is None else f" of {cap}" if engines == 1 else f" of {engines} x {cap}"


def _ge(a: float | None, b: float) -> bool:
    return a is not None and a >= b


def _lt(a: float | None, b: float) -> bool:
    return a is not None and a < b



def _checks(d: dict, r: DiagnosisRules) -> dict[str, list[tuple[bool, str]]]:
    """Each load pattern's conditions, in rule order, each with what was measured."""
    cap_share, ws, kvf = d["running_at_cap_share"], d["waiting_share"], d["kv_full_share"]
    kvmed = d["window_kv_median_pct"]
    preempted = d["window_preemptions"] or 0
    kv_full = _ge(kvf, r.kv_full_min_share) or (_ge(d["window_kv_max_pct"], r.kv_peak_pct) and preempted > 0)
    cap_text = f"running at cap {_pct(cap_share) if cap_share is not None else 'unknown (no max_num_seqs)'}"

    def check(ok: bool, measured: str, needs: str) -> tuple[bool, str]:
        return ok, f"{measured} (needs {needs})"

    waiting = check(_ge(ws, r.waiting_min_share), f"waiting {_pct(ws)}", f">= {_pct(r.waiting_min_share)}")
    # A full server makes requests wait in its queue: where the server timed its requests,
    # that queue must be where their TTFT went (gauges alone cannot tell a queue of a few
    # from the wait that made TTFT long).
    queue_share = d["window_queue_share"]
    queue = [check(_ge(queue_share, r.queue_min_ttft_share), f"vLLM's queue {_pct(queue_share)} of TTFT",
                   f">= {_pct(r.queue_min_ttft_share)}")] if d["window_timed"] else []
    return {
        "KV-capacity pressure": [
            check(kv_full, f"KV >= {r.kv_full_pct:g} % for {_pct(kvf)}",
                  f"{_pct(r.kv_full_min_share)}, or a peak >= {r.kv_peak_pct:g} % with preemptions"),
            waiting,
            # an unknown cap is no headroom: nothing says the cap was not reached
            check(_lt(cap_share, r.kv_pressure_max_cap_share), cap_text, f"< {_pct(r.kv_pressure_max_cap_share)}"),
            *queue,
        ],
        "active-sequence limit": [
            check(_ge(cap_share, r.seq_limit_min_cap_share), cap_text, f">= {_pct(r.seq_limit_min_cap_share)}"),
            waiting,
            check(_lt(kvmed, r.kv_full_pct), f"KV median {_num(kvmed)} %", f"< {r.kv_full_pct:g} %"),
            check(_lt(kvf, r.seq_limit_max_kv_full_share) and preempted <= r.seq_limit_max_preemptions,
                  f"KV full {_pct(kvf)}, {_count(preempted)} preemptions",
                  f"< {_pct(r.seq_limit_max_kv_full_share)} and "
                  + ("none" if r.seq_limit_max_preemptions == 0 else f"<= {r.seq_limit_max_preemptions}")),
            *queue,
        ],
        "reference": [
            check(_lt(ws, r.reference_max_waiting_share), f"waiting {_pct(ws)}",
                  f"< {_pct(r.reference_max_waiting_share)}"),
            check(_lt(cap_share, r.reference_max_cap_share), cap_text, f"< {_pct(r.reference_max_cap_share)}"),
            check(_lt(kvf, r.reference_max_kv_full_share), f"KV full {_pct(kvf)}",
                  f"< {_pct(r.reference_max_kv_full_share)}"),
        ],
    }


def _label(d: dict, row: dict, r: DiagnosisRules) -> tuple[str, str]:
    if row["status"] == "failed" or not row["n_requests"]:
        return "failed", (row.get("error") or "no requests recorded").strip().splitlines()[0]
    if row["n_requests"] == row["n_not_sent"]:
        return "failed", "no request was sent"
    if d["waiting_share"] is None:
        return "unclassified", "no scheduler samples in the loaded window"
    coverage, scrapes = d["scrape_coverage"], d["window_scrapes"] or 0
    if _lt(coverage, r.min_scrape_coverage):
        return "unclassified", (f"scrapes cover only {_pct(coverage)} of the loaded window "
                                f"(needs >= {_pct(r.min_scrape_coverage)})")
    if scrapes < r.min_window_scrapes:
        return "unclassified", (f"{scrapes} scrape{'s' if scrapes != 1 else ''} in the loaded window "
                                f"(needs >= {r.min_window_scrapes})")
    ratio, unqueued = d["interference_ratio"], d["interference_prefill_ratio"]
    not_interference = []  # why a TTFT ratio that passed did not make the label
    if _ge(ratio, r.interference_min_ratio):
        head = f"{row['n_during']} requests arriving during long prefills"
        ttft = f"TTFT p90 {ratio:.1f}x that of the other {row['n_apart']}"
        if unqueued is None:
            return "prefill-decode interference", f"{head}: {ttft} (" + (
                "TTFT alone: too few of them with per-request server timings)" if d["window_timed"] else
                "gauges and client times: no per-request server timings, long prefills counted from their send)")
        if unqueued >= r.interference_min_prefill_ratio:
            return "prefill-decode interference", (
                f"{head} (vLLM's prefill intervals): {ttft}; outside vLLM's queue {unqueued:.1f}x "
                "(its per-request timings)")
        not_interference.append(
            f"prefill-decode interference: {ttft} but outside vLLM's queue {unqueued:.1f}x "
            f"(needs >= {r.interference_min_prefill_ratio:g}x)")
    checks = _checks(d, r)
    fits = next((label for label, cs in checks.items() if all(ok for ok, _ in cs)), None)
    cap, engines = row["cap"], row["engines"]
    cap_note = "" if cap is not None else "; max_num_seqs unknown: no at-cap signal"
    if fits == "KV-capacity pressure":
        return fits, (f"KV at or above {r.kv_full_pct:g} % for {_pct(d['kv_full_share'])} of the loaded time, "
                      f"{d['window_preemptions'] or 0:.0f} preemptions, "
                      f"running at most {_count(d['window_running_max'])}{_of(cap, engines)}, "
                      f"waiting in {_pct(d['waiting_share'])} of the time{cap_note}{_queue_evidence(d)}")
    if fits == "active-sequence limit":
        return fits, (f"running at >= {math.ceil(r.cap_frac * cap * engines)}{_of(cap, engines)} for "
                      f"{_pct(d['running_at_cap_share'])} "
                      f"of the loaded time while KV median was {_num(d['window_kv_median_pct'])} %"
                      f"{_queue_evidence(d)}")
    if fits == "reference":
        return fits, (f"waiting {_pct(d['waiting_share'])} of the time, "
                      f"running median {_count(d['window_running_median'])}{_of(cap, engines)}, "
                      f"KV median {_num(d['window_kv_median_pct'])} %{cap_note}")
    return "unclassified", "fits no pattern: " + "; ".join(not_interference + [
        f"{label}: " + ", ".join(text for ok, text in cs if not ok) for label, cs in checks.items()])


def _queue_evidence(d: dict) -> str:
    """What a limit's label rests on beyond the gauges, for its clue."""
    if not d["window_timed"]:
        return "; gauges only: the server reported no per-request timings"
    return (f"; vLLM's queue was {_pct(d['window_queue_share'])} of the TTFT of the {d['window_timed']} "
            "requests arriving in the loaded window (its per-request timings)")


def _warnings(d: dict, row: dict, r: DiagnosisRules) -> list[str]:
    out = []
    if row["status"] == "partial" or row["n_not_sent"]:
        unsent = row["n_not_sent"]
        out.append("partial run" + (f" ({unsent} of {row['n_requests']} requests never sent)" if unsent else ""))
    lag, failed = d["lag_p99_ms"], d["failed_share"]
    if lag is not None and lag > r.max_lag_ms:
        out.append(f"client-limited (dispatch lag p99 {lag:.0f} ms > {r.max_lag_ms:g} ms)")
    cpu, arrivals = d["client_cpu_share"], d["arrival_ratio"]
    if cpu is not None and cpu >= r.max_client_cpu_share:
        out.append(f"client-limited (its busiest process used {_pct(cpu)} of a core over the replay, >= "
                   f"{_pct(r.max_client_cpu_share)})")
    if arrivals is not None and arrivals < r.min_arrival_ratio:
        out.append(f"client-limited (sent {_pct(arrivals)} of the scheduled arrival rate, needs >= "
                   f"{_pct(r.min_arrival_ratio)})")
    if failed is not None and failed > r.max_failed_share:
        out.append(f"errors ({_pct(failed)} of sent requests failed)")
    if not d["littles_ok"]:
        big_l, lambda_w = d["littles_L_server"], d["littles_lambda_W"]
        out.append(f"Little's law mismatch (L {big_l:.1f} against lambda W {lambda_w:.1f})")
    return out


def write_diagnosis(db_path: str | Path, rules: DiagnosisRules,
                    expect: Mapping[str, str] | None = None, parts: Mapping[str, object] | None = None) -> pl.DataFrame:
    """Compute the diagnosis and store it as table `diagnosis`, swapping the file in whole;
    with `parts` (the study's, filledfirst.study.Part by name) also table `study_parts`."""
    from filledfirst.store.ingest import edited_copy, upgrade
    from filledfirst.store.study_parts import store_parts

    if not Path(db_path).is_file():
        raise UserError(f"{db_path}: no such database (run `filledfirst ingest` first)")
    with edited_copy(db_path) as con:
        if not con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'runs'").fetchall()[0][0]:
            raise UserError(f"{db_path}: no runs table (run `filledfirst ingest` first)")
        upgrade(con)  # a database ingested before the requests gained a column
        df = diagnose(con, rules, expect)
        con.register("_diagnosis_new", df.to_arrow())
        con.execute("CREATE OR REPLACE TABLE diagnosis AS SELECT * FROM _diagnosis_new")
        con.unregister("_diagnosis_new")
        # The report states the thresholds the labels were made with, not the defaults.
        con.execute("CREATE OR REPLACE TABLE diagnosis_rules (rules JSON)")
        con.execute("INSERT INTO diagnosis_rules VALUES (?)", [json.dumps(asdict(rules))])
        if parts is not None:
            store_parts(con, parts)
    return df


def stored_rules(con: duckdb.DuckDBPyConnection) -> DiagnosisRules:
    """The rules the stored diagnosis was made with (the defaults for a database without)."""
    if not con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'diagnosis_rules'"
                       ).fetchall()[0][0]:
        return DiagnosisRules()
    rows = con.execute("SELECT rules FROM diagnosis_rules").fetchall()
    return DiagnosisRules.from_config(json.loads(rows[0][0]) if rows else None)
