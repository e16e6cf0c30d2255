"""One run's features, as the rules judge them and table `diagnosis` stores them: the
windowed SQL's row (filledfirst.analysis.diagnosis.sql) made typed, with what is derived
from it in Python: Little's law, goodput, the KV ledger, the first crossings, the
interference ratios only where enough requests back them, and the token budget's use only
where the budget is known.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from filledfirst.analysis.diagnosis.kv_ledger import kv_ledger
from filledfirst.analysis.diagnosis.labels import Label
from filledfirst.analysis.diagnosis.scheduler import Bindings
from filledfirst.analysis.numbers import share
from filledfirst.contracts.runmeta import RunMeta
from filledfirst.engines import ENGINES
from filledfirst.study import DiagnosisRules


@dataclass(frozen=True)
class Features:
    """A field per feature; a share is 0-1, a `*_pct` in percent, times in s or ms as named.
    NULL (None) where it was not measured."""

    run_id: str
    experiment: str
    status: str  # of the run: ok, partial, failed
    error: str | None
    n_requests: int  # scheduled, sent or not
    n_not_sent: int
    cap: int | None  # max_num_seqs per engine (filledfirst.analysis.diagnosis.window)
    engines: int
    window_start_s: float | None
    window_end_s: float | None
    # over the loaded window, time-weighted
    running_at_cap_share: float | None  # None where the cap is not known
    waiting_share: float | None  # waiting > 0
    kv_full_share: float | None  # KV at or above kv_full_pct
    scrape_coverage: float | None  # of the window, by scrapes' held values
    # over the scrapes inside the window
    window_scrapes: int | None
    window_running_median: float | None
    window_running_max: float | None
    window_waiting_median: float | None
    window_kv_median_pct: float | None
    window_kv_max_pct: float | None
    window_preemptions: float | None  # the counter's increase inside the window
    # whole run (filledfirst.analysis.signals)
    queue_time_p50_ms: float | None  # vLLM's queue-time histogram
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    ttft_timeouts: int | None
    lag_p99_ms: float | None  # dispatch lag
    failed_share: float | None  # of the requests sent
    first_crossings: str | None  # when each limit was first touched, on the run's clock
    t_first_cap_s: float | None  # running first at the cap (None: never, or no cap known)
    t_first_kv_s: float | None  # KV first at or above kv_full_pct
    # Little's law: the server's mean running + waiting against the client's lambda W
    littles_L_server: float | None
    littles_lambda_W: float | None
    littles_ratio: float | None
    littles_ok: bool  # true where not checked
    goodput_rps: float | None
    slo_met_share: float | None  # of the requests sent
    # of the answered requests arriving in the loaded window: the share that met the SLO,
    # and how many were over its TTFT
    window_answered: int | None
    window_slo_met_share: float | None
    ttft_over: int | None
    # the KV ledger (filledfirst.analysis.diagnosis.kv_ledger)
    kv_bytes_per_token: float | None
    kv_capacity_tokens: float | None
    kv_fit_concurrency: float | None
    # requests arriving during long prefills against the others: TTFT p90 ratio, and
    # that of the TTFT outside vLLM's queue (None without enough of them)
    interference_ratio: float | None
    interference_prefill_ratio: float | None
    n_during: int | None
    n_apart: int | None
    # vLLM's queue over the TTFT of the requests arriving in the window, and how many had
    # the server's per-request timings
    window_queue_share: float | None
    window_timed: int
    # the per-step token budget (max_num_batched_tokens), the engine steps taken while
    # requests waited (from a scrape that saw a queue to the next) and the share of the
    # budget those steps used on average (None where the budget or the steps are not known)
    token_budget: int | None
    budget_queued_steps: int | None
    budget_fill: float | None
    # did the client keep up (signals.CLIENT)
    client_cpu_share: float | None
    client_cpu_ms_per_1k_tokens: float | None
    arrival_ratio: float | None  # sent over scheduled arrival rate, open loop
    counter_drops: int | None  # times the generated-token counter went down between two scrapes
    # the prefix cache over the window's answered requests: whether the server cached
    # prefixes, the share of their prompt tokens an unbounded cache would have served (a
    # schedule with prefix structure), the share it served, and the one over the other
    prefix_caching: bool | None
    ideal_hit_share: float | None
    measured_hit_share: float | None
    cache_efficiency: float | None
    # what held the requests that waited in the window (filledfirst.analysis.diagnosis.scheduler)
    bindings: Bindings
    waited_request_s: float | None  # request-seconds of waiting the scrapes saw in the window
    bound: str | None  # every constraint's share of that waiting, largest first
    step_ms: float | None  # the mean step time while requests waited for the step in flight
    prefill_share: float | None  # of the tokens those steps computed
    notes: tuple[str, ...]  # what could not be checked and why
    engine: str | None  # whose metrics the run's scrapes carry (filledfirst.engines), None: none scraped


def features(row: Mapping[str, Any], meta: RunMeta, r: DiagnosisRules, bindings: Bindings) -> Features:
    """`row`: one of filledfirst.analysis.diagnosis.sql.measure's; `bindings`: what held
    the run's waiting requests. Every field not derived here is the SQL column of its name."""
    notes: list[str] = []
    n = row["n_requests"] - row["n_not_sent"]  # what the server saw
    littles = _littles(row, meta, r, notes)
    ledger, why = kv_ledger(row["cache_labels"], row["mean_tokens"], meta)
    if ledger.bytes_per_token is None and row["n_requests"]:
        notes.append(f"KV bytes per token not known ({why})")
    if row["cap"] is None:
        notes.append(f"max_num_seqs unknown{_STATE_IT}: no at-cap signal, so no label {Label.SEQ_LIMIT}")
    engine = next((e for e in ENGINES if e.prefix == row.get("engine_prefix")), None)
    if engine is not None:
        notes += [f"{engine.name}'s metrics do not tell {what}" for what in engine.cannot]
    derived: dict[str, Any] = dict(
        window_start_s=row["start"], window_end_s=row["stop"],
        running_at_cap_share=None if row["cap"] is None else row["running_at_cap_share"],
        failed_share=row["n_failed"] / n if n else None,
        first_crossings=_crossings(row, r) if n else None,
        t_first_cap_s=row["t_first_cap"] if row["cap"] is not None else None, t_first_kv_s=row["t_first_kv"],
        interference_ratio=row["interference_ratio"] if _enough_during(row, r) else None,
        interference_prefill_ratio=(row["interference_prefill_ratio"]
                                    if _enough_during(row, r, row["n_during_timed"]) else None),
        window_timed=row["window_timed"] or 0,
        **_budget(row, notes),
        **littles, **_goodput(row),
        kv_bytes_per_token=ledger.bytes_per_token, kv_capacity_tokens=ledger.capacity_tokens,
        kv_fit_concurrency=ledger.fit_concurrency,
        prefix_caching=meta.server.settings.get("enable_prefix_caching"),
        **_cache(row),
        bindings=bindings, waited_request_s=bindings.waited if row["n_requests"] else None,
        bound=", ".join(f"{c} {share(part)}" for c, part in bindings.shares if part >= 0.005) or None,
        step_ms=bindings.step_ms, prefill_share=bindings.prefill_share,
        notes=tuple(notes), engine=engine.name if engine is not None else None,
    )
    return Features(**{f.name: row[f.name] for f in fields(Features) if f.name not in derived}, **derived)


# How a server the study did not start gets its limits known (its /metrics does not say them).
_STATE_IT = " (a server the study did not start: `replay --max-num-seqs`, or its server.max_num_seqs)"


def _budget(row: Mapping[str, Any], notes: list[str]) -> dict[str, Any]:
    budget, steps = row["budget"], row["queued_steps"]
    why = ("the server's log and settings do not say it" if budget is None
           else "no step histogram was scraped" if steps is None else None)
    if why and row["n_requests"]:
        hint = _STATE_IT.replace("max_num_seqs", "max_num_batched_tokens") if budget is None else ""
        notes.append(f"the per-step token budget's use not measured: {why}{hint}, so no label {Label.TOKEN_BUDGET}")
    # A prompt's tokens count at the step it finishes (vLLM's step histogram): a stretch's
    # first step may carry a prompt mostly computed before it, so the mean can pass the
    # budget; kept as measured, so the bias shows.
    fill = row["queued_tokens"] / (steps * budget) if why is None and steps else None
    return {"token_budget": budget, "budget_queued_steps": None if why else int(steps), "budget_fill": fill}


def _enough_during(row: Mapping[str, Any], r: DiagnosisRules, timed: int | None = None) -> bool:
    """One slow request behind one long prompt is an anecdote, not a pattern. `timed`: how
    many of those requests had server timings, when that is what counts."""
    during, apart = row["n_during"] or 0, row["n_apart"] or 0
    return (apart > 0 and during >= r.interference_min_requests
            and during >= r.interference_min_share * (during + apart)
            and (timed is None or timed >= r.interference_min_requests))


def _crossings(row: Mapping[str, Any], r: DiagnosisRules) -> str:
    """When each limit was first touched, on the run's clock (whole run, not the window)."""
    if row["window_running_median"] is None and row["t_first_waiting"] is None:
        return "no scheduler samples"
    events = [("waiting>0", row["t_first_waiting"]),
              ("running at cap", row["t_first_cap"] if row["cap"] is not None else "unknown"),
              (f"KV>={r.kv_full_pct:g} %", row["t_first_kv"])]
    seen = sorted((t, name) for name, t in events if isinstance(t, float))
    rest = [f"{name} never" if t is None else "cap unknown" for name, t in events if not isinstance(t, float)]
    return "; ".join(x for x in (", ".join(f"{name} at {t:.1f} s" for t, name in seen), ", ".join(rest)) if x)


def _littles(row: Mapping[str, Any], meta: RunMeta, r: DiagnosisRules, notes: list[str]) -> dict[str, Any]:
    """L (what the server holds, running + waiting, time-averaged) against lambda W from the
    client's records: a check that the gauges and the records describe the same requests.
    lambda W is taken in its sample-path form, the time-average of the requests in flight
    = (requests present in the window / its length) x (their mean time inside it): exact
    for any window, where arrivals-in-window x mean sojourn assumes a steady state that
    requests outlasting the window (the decoders of the interference runs) break."""
    arrivals, lambda_w, big_l = row["arrivals"] or 0, row["lambda_w"], row["littles_L_server"]
    skip = ("closed loop" if meta.closed_loop
            else f"{arrivals} arrivals in the window" if arrivals < r.littles_min_arrivals
            else "no scheduler samples" if big_l is None or not lambda_w else None)
    if skip:
        notes.append(f"Little's law not checked: {skip}")
        return {"littles_L_server": None, "littles_lambda_W": None, "littles_ratio": None, "littles_ok": True}
    ratio = big_l / lambda_w
    return {"littles_L_server": big_l, "littles_lambda_W": lambda_w, "littles_ratio": ratio,
            "littles_ok": r.littles_min_ratio <= ratio <= r.littles_max_ratio}


def _cache(row: Mapping[str, Any]) -> dict[str, Any]:
    """Shares of the prompt tokens: the ideal's where the schedule had prefix blocks, the
    cache's where the server said what it served; and the second over the first."""
    prompt, hit, ideal = row["cache_prompt_tokens"], row["cache_hit_tokens"], row["cache_ideal_tokens"]
    ideal_share = ideal / prompt if prompt and ideal is not None else None
    measured = hit / prompt if prompt and hit is not None else None
    return {"ideal_hit_share": ideal_share, "measured_hit_share": measured,
            "cache_efficiency": hit / ideal if ideal and hit is not None else None}


def _goodput(row: Mapping[str, Any]) -> dict[str, Any]:
    """The offered load (signals.OFFERED) times the share of sent requests that met the SLO."""
    met, n, offered = row["met"], row["n"], row["offered_rps"]
    share = met / n if met is not None and n else None
    answered = row["window_answered"]
    return {"goodput_rps": offered * share if share is not None and offered is not None else None,
            "slo_met_share": share, "window_slo_met_share": row["window_met"] / answered if answered else None}
