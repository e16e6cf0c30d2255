"""The per-request metrics, defined once, as SQL over the records' tables (`requests`,
`tokens`: filledfirst.contracts.records): TTFT, the gaps between tokens, a request's
longest stall, and whether it met an SLO. The signals (filledfirst.analysis.signals) build
every run-level figure on them; the capacity search judges each probe with the same SQL
over the probe's records in memory (filledfirst.run.search), so a probe's attainment and a
run's goodput can never disagree on what met the SLO. The definitions are in the signals'
docstring.
"""

from __future__ import annotations

OK = "ok"
NOT_SENT = "not_sent"
# A request the server saw and did not answer in full.
FAILED = f"status NOT IN ('{OK}', '{NOT_SENT}')"


def ok_ms(t_end: str, t_start: str = "t_scheduled", alias: str = "") -> str:
    """`t_end - t_start` of a `requests` row in ms, NULL unless the request succeeded
    (`alias`: the table's alias in the query, if it needs one)."""
    a = f"{alias}." if alias else ""
    return f"CASE WHEN {a}status = '{OK}' THEN ({a}{t_end} - {a}{t_start}) * 1000 END"


def ttft_ms(alias: str = "") -> str:
    """TTFT in ms, the one definition: from arrival (t_scheduled) to the first token, NULL
    unless the request succeeded."""
    return ok_ms("t_first_token", alias=alias)


# Per-request TTFT in ms, NULL unless the request succeeded and produced a first token.
REQUEST_TTFT = f"""
SELECT run_id, request_id, role, status, error, t_scheduled,
       {ttft_ms()} AS ttft_ms,
       t_first_token IS NULL AS ttft_missing,
       -- dispatch lag: how late the client sent; large values mean the client, not the
       -- server, was the limit (open loop; ~0 by construction in a closed loop)
       (t_sent - t_scheduled) * 1000 AS lag_ms,
       -- from the moment the request left: what the server's own TTFT histogram can see
       {ok_ms("t_first_token", "t_sent")} AS ttft_from_send_ms,
       -- first content token: later than the first token when a model reasons first
       {ok_ms("t_first_content")} AS ttft_content_ms,
       reasoning_tokens,
       -- usage against what was asked: token-id prompts must match exactly
       status = '{OK}' AND (prompt_tokens_received IS DISTINCT FROM prompt_tokens
                            OR output_tokens_received IS DISTINCT FROM output_tokens) AS usage_mismatch
FROM requests
"""

# One row per inter-chunk gap of an ok request. Chunks with n = 0 (e.g. the final usage
# chunk) carry no token, so they are dropped before the gaps are taken.
ITL_GAPS = f"""
WITH chunks AS (
    SELECT k.run_id, k.request_id, r.role, k.t, sum(k.n) AS n
    FROM tokens k
    JOIN requests r USING (run_id, request_id)
    WHERE r.status = '{OK}' AND k.n > 0
    GROUP BY k.run_id, k.request_id, r.role, k.t
),
gaps AS (
    SELECT run_id, request_id, role, n,
           (t - lag(t) OVER (PARTITION BY run_id, request_id ORDER BY t)) * 1000 AS gap_ms
    FROM chunks
)
SELECT run_id, request_id, role, gap_ms / n AS itl_ms, gap_ms AS itl_chunk_ms FROM gaps WHERE gap_ms IS NOT NULL
"""

# Per request: its longest wait for a token once the first one came.
REQUEST_STALL = f"SELECT run_id, request_id, max(itl_chunk_ms) AS max_gap_ms FROM ({ITL_GAPS}) GROUP BY ALL"


def slo_met(ttft: str = "ttft_ms", max_gap: str = "max_gap_ms") -> str:
    """The SLO test of one request (parameters $slo_ttft and $slo_itl, in ms): a TTFT
    within, and its longest gap between tokens within; a single chunk has no gap, so
    cannot miss the ITL part. A request that failed has no TTFT: it missed."""
    return f"({ttft} <= $slo_ttft AND coalesce({max_gap}, 0) <= $slo_itl)"


# Per run: how its requests fared against an SLO ($slo_ttft, $slo_itl ms). `n` is every
# request the schedule held, since one never sent missed too; `failed` never got a first
# token; `ttft_over`, `itl_over` count the ok ones over each part (both may count one);
# `lifetime_p90_s` is the 90th percentile, from arrival to end, of the ok ones.
# Per request: its arrival, end, TTFT and longest stall, the SLO test's inputs.
SLO_REQUESTS = f"""
SELECT q.run_id, q.request_id, q.t_scheduled, q.t_done, {ttft_ms('q')} AS ttft_ms, s.max_gap_ms
FROM requests q LEFT JOIN ({REQUEST_STALL}) s USING (run_id, request_id)
"""

SLO_ATTAINMENT = f"""
WITH r AS ({SLO_REQUESTS})
SELECT run_id, count(*) AS n, count(*) FILTER (WHERE {slo_met()}) AS met,
       count(*) FILTER (WHERE ttft_ms IS NULL) AS failed,
       count(*) FILTER (WHERE ttft_ms > $slo_ttft) AS ttft_over,
       count(*) FILTER (WHERE ttft_ms IS NOT NULL AND max_gap_ms > $slo_itl) AS itl_over,
       quantile_cont(t_done - t_scheduled, 0.9) FILTER (WHERE ttft_ms IS NOT NULL) AS lifetime_p90_s
FROM r GROUP BY run_id
"""
