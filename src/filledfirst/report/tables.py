"""The report's tables and sentences of signals, requests and workloads: plain values in,
HTML out through filledfirst.report.markup, which escapes every data string."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from filledfirst.analysis import numbers
from filledfirst.contracts.stats import Placement, ScheduleStats
from filledfirst.report.markup import html_table
from filledfirst.report.rows import (
    ClientCheck,
    PrefixCacheRow,
    RequestCheck,
    RoleRow,
    RunRow,
    SweepLine,
    TtftCheck,
    TtftPart,
)

# A per-request server timing the server did not send (other servers, older vLLM, vLLM
# without --enable-per-request-metrics): not a zero, and not our failure to measure.
NOT_REPORTED = "not reported by the server"


# --- signal tables -------------------------------------------------------------------------

def cap_suffix(row: RunRow) -> str:
    cap = row.max_num_seqs
    return f" (max_num_seqs {cap})" if cap is not None else ""


# (label, formatter) per run_summary row; one list so the per-run and the side-by-side
# tables can never disagree on what a row means.
def requests_cell(r: RunRow) -> str:
    """Never-sent requests are no failures: the server never saw them."""
    unsent = r.n_not_sent or 0
    return f"{r.n_requests:,}" + (f" ({unsent:,} never sent)" if unsent else "")


SIGNAL_ROWS: list[tuple[str, Callable[[RunRow], str]]] = [
    ("requests", requests_cell),
    ("failed requests", lambda r: f"{r.n_failed:,}"),
    ("TTFT p50", lambda r: numbers.ms(r.ttft_p50_ms)),
    ("TTFT p90", lambda r: numbers.ms(r.ttft_p90_ms)),
    ("no first token in time (timeouts)", lambda r: f"{r.ttft_timeouts or 0:,}"),
    ("ITL p50", lambda r: numbers.ms(r.itl_p50_ms)),
    ("ITL p99", lambda r: numbers.ms(r.itl_p99_ms)),
    ("ITL per chunk p50 / p99",
     lambda r: f"{numbers.ms(r.itl_chunk_p50_ms)} / {numbers.ms(r.itl_chunk_p99_ms)}"),
    ("running (median / max)",
     lambda r: f"{numbers.count(r.running_median)} / {numbers.count(r.running_max)}{cap_suffix(r)}"),
    ("waiting (median / max)",
     lambda r: f"{numbers.count(r.waiting_median)} / {numbers.count(r.waiting_max)}"),
    ("KV (median / max)", lambda r: f"{numbers.percent(r.kv_median_pct)} / {numbers.percent(r.kv_max_pct)}"),
    ("preemptions", lambda r: numbers.count(r.preemptions)),
    ("dispatch lag (p50 / p99)", lambda r: f"{numbers.ms(r.lag_p50_ms)} / {numbers.ms(r.lag_p99_ms)}"),
]


def run_signal_table(row: RunRow) -> str:
    return html_table(["signal", "value"], ((label, f(row)) for label, f in SIGNAL_ROWS))


def compare_table(rows: Sequence[RunRow]) -> str:
    """Signals as rows, one column per run."""
    body = ([label, *(f(r) for r in rows)] for label, f in SIGNAL_ROWS)
    return html_table(["", *(r.run_id for r in rows)], body)


def measurement_table(rows: Sequence[RunRow], clients: Mapping[str, ClientCheck],
                      checks: Mapping[str, TtftCheck]) -> str:
    """Can the numbers be trusted? Client lag, usage against what was asked, what the
    scraper could not use, and our TTFT beside vLLM's own histogram (`clients`: the
    client's checks by run id; `checks`: ttft_against_server rows by run id)."""
    def server(c: TtftCheck) -> str:
        if c.server_ttft_p50_ms is None:
            return "n/a"
        return (f"{numbers.ms(c.server_ttft_p50_ms)} (bucket {numbers.ms(c.bucket_lo_ms)} to "
                f"{numbers.ms(c.bucket_hi_ms)})")

    body = []
    for r in rows:
        c = checks.get(r.run_id) or TtftCheck(run_id=r.run_id)
        client = clients.get(r.run_id) or ClientCheck(run_id=r.run_id)
        ratio = c.ratio
        body.append([
            r.run_id, f"{numbers.ms(r.lag_p50_ms)} / {numbers.ms(r.lag_p99_ms)}", client_cpu(client),
            numbers.share(client.arrival_ratio) if client.arrival_ratio is not None else "n/a",
            f"{r.n_usage_mismatch:,}", f"{r.reasoning_tokens:,}",
            f"{r.scrape_errors or 0:,} / {r.nonfinite_samples or 0:,}",
            numbers.ms(c.client_ttft_p50_ms), server(c),
            f"{ratio:.2f}" if ratio is not None else "n/a",
            {True: "yes", False: "NO"}.get(c.agrees, "n/a"),
        ])
    return html_table(
        ["run", "dispatch lag p50 / p99", "client CPU: share of a core, per 1,000 tokens",
         "arrivals sent / scheduled", "usage not as asked", "reasoning tokens",
         "scrapes failed / values not finite",
         "our TTFT p50 (from send)", "vLLM's TTFT histogram median", "ours / vLLM's", "agree"],
        body,
    )


def client_cpu(r: ClientCheck) -> str:
    """The client's own CPU over the replay (signals.client_checks): share of one core and
    ms per 1,000 streamed tokens; n/a for runs that did not record it."""
    share, per_1k = r.client_cpu_share, r.client_cpu_ms_per_1k_tokens
    if share is None:
        return "n/a"
    return f"{numbers.share(share)}, {per_1k:.0f} ms" if per_1k is not None else numbers.share(share)


def role_table(rows: Sequence[RoleRow]) -> str:
    """The seed's interference table: one line per request role."""
    body = (
        [r.role, f"{r.n:,}", f"{r.n_failed:,}", numbers.ms(r.ttft_p50_ms),
         numbers.ms(r.ttft_p90_ms), numbers.ms(r.itl_p50_ms), numbers.ms(r.itl_p99_ms)]
        for r in rows
    )
    return html_table(["role", "n", "failed", "TTFT p50", "TTFT p90", "ITL p50", "ITL p99"], body)


def runs_table(rows: Sequence[RunRow]) -> str:
    body = (
        [r.run_id, r.experiment, r.status, f"{r.n_requests:,}", f"{r.n_failed:,}",
         f"{r.n_not_sent or 0:,}", numbers.seconds(r.duration_s), r.error or ""]
        for r in rows
    )
    return html_table(["run", "experiment", "status", "requests", "failed", "never sent", "duration", "error"], body)


def schedule_sentence(stats: ScheduleStats | None) -> str:
    """The workload in the seed's words, from the schedule's stats file: plain text, for
    `para` to escape (escaped here as well, it showed `&amp;` for `&` in the report)."""
    if not stats or not stats.requests:
        return ""
    p, o = stats.prompt_tokens, stats.output_tokens
    text = (
        f"The workload: {stats.requests:,} requests over {numbers.seconds(stats.duration_s)}; "
        f"median prompt about {numbers.about(p.p50 if p else 0)} tokens, "
        f"p90 around {numbers.about(p.p90 if p else 0)}, median output about {numbers.about(o.p50 if o else 0)}."
    )
    if stats.keep_every:
        scaled = f"gaps scaled by {stats.time_scale:g}" if stats.time_scale not in (None, 1) else ""
        if stats.keep_every > 1:
            text += f" Every {stats.keep_every}th request of the trace window" + (f", {scaled}." if scaled else ".")
        elif scaled:
            text += f" Every request of the trace window, {scaled}."
    dropped = [f"{n:,} {k}" for k, n in (("clipped", stats.clipped), ("skipped", stats.skipped)) if n]
    if dropped:
        text += " Changed or dropped: " + ", ".join(dropped) + "."
    if isinstance(stats.length_scale, float) and stats.length_scale != 1:
        text += f" Sizes scaled by {stats.length_scale:g} from the trace's for a small engine"
        if stats.trace_prompt_tokens:  # UNSET and None are false
            text += f" (trace median prompt about {numbers.about(stats.trace_prompt_tokens.p50)} tokens)"
        text += "."
    if isinstance(stats.block_tokens, int) and stats.block_tokens:
        shared = (f"prefix blocks of {stats.block_tokens:,} tokens as the trace's do" if stats.source != "synthetic"
                  else f"prefixes of {stats.block_tokens:,} tokens")
        text += (f" Prompts share {shared}; an unbounded prefix cache would serve "
                 f"{numbers.share(stats.ideal_hit_share)} of their tokens.")
    placed = [placement_phrase(r) for r in stats.relative or []]
    if placed:
        text += " Placed relative to a measured knee: " + "; ".join(placed) + "."
    return text


def prefix_cache_sentence(row: PrefixCacheRow) -> str:
    """One run's prefix cache in numbers (analysis.prefix_cache.counts' row)."""
    text = (f"Prefix cache: of the prompt tokens of the {row.n_with_ideal - (row.n_unreported or 0):,} "
            f"requests that reported it, an unbounded cache would have served {numbers.share(row.ideal_share)}; "
            f"the server served {numbers.share(row.answers_share)} by its answers")
    if row.server_share is not None:
        text += f" and {numbers.share(row.server_share)} of its lookups by its own counters"
    text += "."
    if row.n_unreported:
        text += f" {row.n_unreported:,} sent request(s) reported no cached tokens (failed or cut short)."
    return text


def placement_phrase(resolved: Placement) -> str:
    """One resolved knee-relative rate of a schedule (filledfirst.frontier.relative): what
    it is relative to, the knee the search measured, and the rate that made."""
    what = f"the {resolved.role} requests" if resolved.role else "the trace's time scale"
    text = (f"{what} at {resolved.times:g}x the knee of {resolved.of} "
            f"({resolved.knee_rps:.3g} req/s held): {resolved.rate_rps:.3g} req/s")
    if resolved.time_scale is not None:
        text += f", time scale {resolved.time_scale:.3g}"
    return text


def run_sentence(row: RunRow) -> str:
    """Short seed-style sentences, numbers only from the data."""
    if row.n_requests == 0:
        return f"No requests were measured (run status: {row.status})."
    parts = [
        f"{row.n_requests:,} requests, {row.n_failed:,} failed"
        + (f", {row.n_not_sent:,} never sent." if row.n_not_sent else "."),
        f"TTFT p50 was {numbers.ms(row.ttft_p50_ms)}, p90 {numbers.ms(row.ttft_p90_ms)}"
        + (f" ({row.ttft_timeouts:,} more got no first token in time)." if row.ttft_timeouts else "."),
    ]
    if row.running_max is not None:
        cap = row.max_num_seqs
        of_cap = f" of max_num_seqs {cap}" if cap is not None else ""
        parts.append(
            f"Running had a median of {numbers.count(row.running_median)} and peaked at "
            f"{numbers.count(row.running_max)}{of_cap}; waiting peaked at {numbers.count(row.waiting_max)}."
        )
    if row.kv_max_pct is not None:
        parts.append(
            f"KV use had a median of {numbers.percent(row.kv_median_pct)} and peaked at "
            f"{numbers.percent(row.kv_max_pct)}."
        )
    if row.preemptions:
        parts.append(f"{numbers.count(row.preemptions)} preemptions.")
    return " ".join(parts)


def interference_table(roles: Sequence[RoleRow], experiments: Mapping[str, str]) -> str:
    """Role rows of every interference run (`experiments`: run id -> experiment)."""
    body = [
        [experiments[r.run_id], r.role, f"{r.n:,}", f"{r.n_failed:,}", numbers.ms(r.ttft_p50_ms),
         numbers.ms(r.ttft_p90_ms), numbers.ms(r.itl_p50_ms), numbers.ms(r.itl_p99_ms)]
        for r in roles if r.run_id in experiments
    ]
    return html_table(["run", "role", "n", "failed", "TTFT p50", "TTFT p90", "ITL p50", "ITL p99"], body)


def sweep_table(rows: Sequence[SweepLine]) -> str:
    """A line per run of the sweep, by concurrency."""
    body = (
        [r.sweep, str(r.concurrency), f"{r.run.n_requests:,}", f"{r.run.n_failed:,}", numbers.ms(r.run.ttft_p50_ms),
         numbers.ms(r.rates.ttft_p95_ms), numbers.count(r.rates.tok_s_per_request),
         numbers.count(r.rates.total_tok_s), reported_share(r.queue_share), r.label or NOT_REPORTED]
        for r in rows
    )
    return html_table(
        ["sweep", "concurrency", "requests", "failed", "TTFT p50", "TTFT p95", "tok/s per request", "total tok/s",
         "the server's queue share of TTFT", "what filled first"], body
    )


def reported_share(v: float | None) -> str:
    return NOT_REPORTED if v is None else numbers.share(v)


# --- the request path (filledfirst.analysis.request_path) ------------------------------------


def ttft_parts_sentence(rows: Sequence[TtftPart]) -> str:
    """What the run's TTFT-parts chart rests on, or why there is none (`rows`:
    request_path.ttft_parts of one run)."""
    roles = {r.role: r for r in rows}  # n_ok and n_timed are per role
    untimed = [role for role, r in roles.items() if not r.n_timed]
    if not roles:
        return "TTFT parts: no request succeeded."
    if len(untimed) == len(roles):
        return f"TTFT parts (server queue, server prefill): {NOT_REPORTED}."
    timed = sum(r.n_timed for r in roles.values())
    ok = sum(r.n_ok for r in roles.values())
    text = f"TTFT parts from vLLM's per-request timings of {timed:,} of {ok:,} successful requests."
    if untimed:
        text += f" {', '.join(untimed)}: {NOT_REPORTED}."
    return text


def request_check_table(rows: Sequence[RequestCheck]) -> str:
    """Our TTFT from send against vLLM's queue + prefill of the same request, per run (`rows`:
    request_path.against_server): their difference, the front end and transport, as a
    distribution."""
    body = []
    for r in rows:
        if not r.n_timed:
            body.append([r.run_id, f"0 of {r.n_ok:,}", NOT_REPORTED, "", "", ""])
            continue
        body.append([
            r.run_id, f"{r.n_timed:,} of {r.n_ok:,}",
            " / ".join(numbers.ms(q) for q in (r.front_end_p50_ms, r.front_end_p90_ms, r.front_end_p99_ms))
            + f" / {numbers.ms(r.front_end_max_ms)}",
            numbers.share(r.server_share_p50), f"{r.n_server_longer:,}",
            "yes" if r.n_server_longer == 0 else "NO",
        ])
    return html_table(
        ["run", "requests with vLLM's timings", "ours from send - vLLM's queue + prefill: p50 / p90 / p99 / max",
         "vLLM's share of ours (median request)", "vLLM's longer than ours", "consistent"],
        body,
    )


