"""HTML tables and sentences for the report, with every data string escaped.

Cells are plain values; escaping happens here, at the one place text becomes HTML, so
a run's error message or description can never inject markup into the report.
"""

from __future__ import annotations

import html
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from filledfirst.study import DiagnosisRules

DASH = "—"  # a signal that was not measured (failed run, no ok request, no scrape)
# A per-request server timing the server did not send (other servers, older vLLM, vLLM
# without --enable-per-request-metrics): not a zero, and not our failure to measure.
NOT_REPORTED = "not reported by the server"


# nbconvert's lab theme right-aligns every cell with a selector more specific than ours
# (hence !important); the seed's tables read left to right.
_STYLE = """
table.ff-table { margin: 0.5em 0 1em 0; border-collapse: collapse; }
table.ff-table th, table.ff-table td { text-align: left !important; padding: 0.2em 0.8em 0.2em 0; }
table.ff-table caption { text-align: left; font-weight: bold; }
div.ff-chart { margin: 0.5em 0 1.5em 0; }
"""


def style_html() -> str:
    """Once per page: the report's few style rules."""
    return f"<style>{_STYLE}</style>"


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def fmt_ms(v: float | None) -> str:
    """Seed style: '13.1 ms' below 100 ms, '4,737 ms' above."""
    if v is None:
        return DASH
    return f"{v:.1f} ms" if abs(v) < 100 else f"{v:,.0f} ms"


def fmt_pct(v: float | None) -> str:
    return DASH if v is None else f"{v:.1f}%"


def fmt_count(v: float | None) -> str:
    """Gauge medians can fall between two integers; show the half then, not a fake int."""
    if v is None:
        return DASH
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"


def fmt_s(v: float | None) -> str:
    return DASH if v is None else f"{v:,.1f} s"


def fmt_value(v: object) -> str:
    """Setup values from run.json: lists as shell-like words, the rest as text."""
    if v is None:
        return DASH
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, list):
        return " ".join(shlex.quote(str(x)) for x in v)
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.1f}"  # timings, not 17 digits
    return str(v)


def html_table(
    headers: Sequence[str], rows: Iterable[Sequence[object]], *, caption: str | None = None
) -> str:
    """A plain table; the first column is a row header (signal or key names)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        first, *rest = row
        cells = f"<th scope='row'>{esc(first)}</th>" + "".join(f"<td>{esc(c)}</td>" for c in rest)
        body.append(f"<tr>{cells}</tr>")
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return (
        f"<table class='ff-table'>{cap}<thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def para(text: str) -> str:
    return f"<p>{esc(text)}</p>"


def heading(text: str, level: int = 3) -> str:
    return f"<h{level}>{esc(text)}</h{level}>"


def code_details(summary: str, text: str) -> str:
    """Long text (the server command line) folded away but present in the file."""
    return f"<details><summary>{esc(summary)}</summary><pre>{esc(text)}</pre></details>"


def details_html(summary: str, inner_html: str) -> str:
    """A long table folded away: `inner_html` is markup built here (escaped already)."""
    return f"<details><summary>{esc(summary)}</summary>{inner_html}</details>"


# --- run.json sections -------------------------------------------------------------------


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists stay values (argv reads better whole)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def section(meta: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The flattened sub-dict at a dotted path of run.json, {} if absent."""
    node: Any = meta
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return flatten(node) if isinstance(node, Mapping) else {}


def split_common(per_run: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """Keys every run agrees on (shown once) and the keys that differ (shown per run)."""
    keys: list[str] = []
    for values in per_run.values():
        keys += [k for k in values if k not in keys]
    common: dict[str, Any] = {}
    differing: list[str] = []
    runs = list(per_run.values())
    for k in keys:
        vals = [r.get(k) for r in runs]
        if all(k in r for r in runs) and all(v == vals[0] for v in vals):
            common[k] = vals[0]
        else:
            differing.append(k)
    return common, differing


def key_value_table(values: Mapping[str, Any], caption: str | None = None) -> str:
    return html_table(["", "value"], ((k, fmt_value(v)) for k, v in values.items()), caption=caption)


def keys_by_run_table(
    per_run: Mapping[str, Mapping[str, Any]], keys: Sequence[str], caption: str | None = None
) -> str:
    """Keys as rows, runs as columns: the seed's side-by-side comparison shape."""
    rows = ([k, *(fmt_value(v.get(k)) for v in per_run.values())] for k in keys)
    return html_table(["", *per_run], rows, caption=caption)


# --- signal tables -------------------------------------------------------------------------

def cap_suffix(row: Mapping[str, Any]) -> str:
    cap = row.get("max_num_seqs")
    return f" (max_num_seqs {cap})" if cap is not None else ""


# (label, formatter) per run_summary row; one list so the per-run and the side-by-side
# tables can never disagree on what a row means.
def requests_cell(r: Mapping[str, Any]) -> str:
    """Never-sent requests are no failures: the server never saw them."""
    unsent = r.get("n_not_sent") or 0
    return f"{r['n_requests']:,}" + (f" ({unsent:,} never sent)" if unsent else "")


SIGNAL_ROWS: list[tuple[str, Callable[[Mapping[str, Any]], str]]] = [
    ("requests", requests_cell),
    ("failed requests", lambda r: f"{r['n_failed']:,}"),
    ("TTFT p50", lambda r: fmt_ms(r["ttft_p50_ms"])),
    ("TTFT p90", lambda r: fmt_ms(r["ttft_p90_ms"])),
    ("no first token in time (timeouts)", lambda r: f"{r.get('ttft_timeouts') or 0:,}"),
    ("ITL p50", lambda r: fmt_ms(r["itl_p50_ms"])),
    ("ITL p99", lambda r: fmt_ms(r["itl_p99_ms"])),
    ("ITL per chunk p50 / p99", lambda r: f"{fmt_ms(r.get('itl_chunk_p50_ms'))} / {fmt_ms(r.get('itl_chunk_p99_ms'))}"),
    ("running (median / max)",
     lambda r: f"{fmt_count(r['running_median'])} / {fmt_count(r['running_max'])}{cap_suffix(r)}"),
    ("waiting (median / max)",
     lambda r: f"{fmt_count(r['waiting_median'])} / {fmt_count(r['waiting_max'])}"),
    ("KV (median / max)", lambda r: f"{fmt_pct(r['kv_median_pct'])} / {fmt_pct(r['kv_max_pct'])}"),
    ("preemptions", lambda r: fmt_count(r["preemptions"])),
    ("dispatch lag (p50 / p99)", lambda r: f"{fmt_ms(r['lag_p50_ms'])} / {fmt_ms(r['lag_p99_ms'])}"),
]


def run_signal_table(row: Mapping[str, Any]) -> str:
    return html_table(["signal", "value"], ((label, f(row)) for label, f in SIGNAL_ROWS))


def compare_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Signals as rows, one column per run."""
    body = ([label, *(f(r) for r in rows)] for label, f in SIGNAL_ROWS)
    return html_table(["", *(r["run_id"] for r in rows)], body)


def measurement_table(rows: Sequence[Mapping[str, Any]], checks: Mapping[str, Mapping[str, Any]]) -> str:
    """Can the numbers be trusted? Client lag, usage against what was asked, what the
    scraper could not use, and our TTFT beside vLLM's own histogram (`checks`:
    ttft_against_server rows by run id)."""
    def server(c: Mapping[str, Any]) -> str:
        if c.get("server_ttft_p50_ms") is None:
            return "n/a"
        return (f"{fmt_ms(c['server_ttft_p50_ms'])} (bucket {fmt_ms(c['bucket_lo_ms'])} to "
                f"{fmt_ms(c['bucket_hi_ms'])})")

    body = []
    for r in rows:
        c = checks.get(r["run_id"], {})
        ratio = c.get("ratio")
        body.append([
            r["run_id"], f"{fmt_ms(r['lag_p50_ms'])} / {fmt_ms(r['lag_p99_ms'])}", client_cpu(r),
            fmt_share(r["arrival_ratio"]) if r.get("arrival_ratio") is not None else "n/a",
            f"{r['n_usage_mismatch']:,}", f"{r['reasoning_tokens']:,}",
            f"{r.get('scrape_errors') or 0:,} / {r.get('nonfinite_samples') or 0:,}",
            fmt_ms(c.get("client_ttft_p50_ms")), server(c),
            f"{ratio:.2f}" if ratio is not None else "n/a",
            {True: "yes", False: "NO"}.get(c.get("agrees"), "n/a"),
        ])
    return html_table(
        ["run", "dispatch lag p50 / p99", "client CPU: share of a core, per 1,000 tokens",
         "arrivals sent / scheduled", "usage not as asked", "reasoning tokens",
         "scrapes failed / values not finite",
         "our TTFT p50 (from send)", "vLLM's TTFT histogram median", "ours / vLLM's", "agree"],
        body,
    )


def client_cpu(r: Mapping[str, Any]) -> str:
    """The client's own CPU over the replay (signals.client_checks): share of one core and
    ms per 1,000 streamed tokens; n/a for runs that did not record it."""
    share, per_1k = r.get("client_cpu_share"), r.get("client_cpu_ms_per_1k_tokens")
    if share is None:
        return "n/a"
    return f"{fmt_share(share)}, {per_1k:.0f} ms" if per_1k is not None else fmt_share(share)


def role_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The seed's interference table: one line per request role."""
    body = (
        [r["role"], f"{r['n']:,}", f"{r['n_failed']:,}", fmt_ms(r["ttft_p50_ms"]),
         fmt_ms(r["ttft_p90_ms"]), fmt_ms(r["itl_p50_ms"]), fmt_ms(r["itl_p99_ms"])]
        for r in rows
    )
    return html_table(["role", "n", "failed", "TTFT p50", "TTFT p90", "ITL p50", "ITL p99"], body)


def runs_table(rows: Sequence[Mapping[str, Any]]) -> str:
    body = (
        [r["run_id"], r["experiment"], r["status"], f"{r['n_requests']:,}", f"{r['n_failed']:,}",
         f"{r.get('n_not_sent') or 0:,}", fmt_s(r["duration_s"]), r["error"] or ""]
        for r in rows
    )
    return html_table(["run", "experiment", "status", "requests", "failed", "never sent", "duration", "error"], body)


def _about(x: float) -> str:
    """The seed's way of quoting a size: two significant digits ('about 880', '3,600')."""
    if not x:
        return "0"
    digits = 2 if x >= 1000 else 3
    return f"{float(f'{x:.{digits}g}'):,.0f}"


def schedule_sentence(stats: Mapping[str, Any] | None) -> str:
    """The workload in the seed's words, from the schedule's stats file: plain text, for
    `para` to escape (escaped here as well, it showed `&amp;` for `&` in the report)."""
    if not stats or not stats.get("requests"):
        return ""
    p, o = stats.get("prompt_tokens", {}), stats.get("output_tokens", {})
    text = (
        f"The workload: {stats['requests']:,} requests over {fmt_s(stats.get('duration_s'))}; "
        f"median prompt about {_about(p.get('p50', 0))} tokens, p90 around {_about(p.get('p90', 0))}, "
        f"median output about {_about(o.get('p50', 0))}."
    )
    if stats.get("keep_every"):
        text += f" Every {stats['keep_every']}th request of the trace window"
        if stats.get("time_scale", 1) != 1:
            text += f", gaps scaled by {stats['time_scale']:g}"
        text += "."
    dropped = [f"{stats[k]:,} {k.replace('_', ' ')}" for k in ("clipped", "skipped") if stats.get(k)]
    if dropped:
        text += " Changed or dropped: " + ", ".join(dropped) + "."
    placed = [placement_phrase(r) for r in stats.get("relative") or []]
    if placed:
        text += " Placed relative to a measured knee: " + "; ".join(placed) + "."
    return text


def placement_phrase(resolved: Mapping[str, Any]) -> str:
    """One resolved knee-relative rate of a schedule (filledfirst.frontier.relative): what
    it is relative to, the knee the search measured, and the rate that made."""
    what = f"the {resolved['role']} requests" if resolved.get("role") else "the trace's time scale"
    text = (f"{what} at {resolved['times']:g}x the knee of {resolved['of']} "
            f"({resolved['knee_rps']:.3g} req/s held): {resolved['rate_rps']:.3g} req/s")
    if resolved.get("time_scale") is not None:
        text += f", time scale {resolved['time_scale']:.3g}"
    return text


def run_sentence(row: Mapping[str, Any]) -> str:
    """Short seed-style sentences, numbers only from the data."""
    if row["n_requests"] == 0:
        return f"No requests were measured (run status: {row['status']})."
    parts = [
        f"{row['n_requests']:,} requests, {row['n_failed']:,} failed"
        + (f", {row['n_not_sent']:,} never sent." if row.get("n_not_sent") else "."),
        f"TTFT p50 was {fmt_ms(row['ttft_p50_ms'])}, p90 {fmt_ms(row['ttft_p90_ms'])}"
        + (f" ({row['ttft_timeouts']:,} more got no first token in time)." if row.get("ttft_timeouts") else "."),
    ]
    if row["running_max"] is not None:
        cap = row.get("max_num_seqs")
        of_cap = f" of max_num_seqs {cap}" if cap is not None else ""
        parts.append(
            f"Running had a median of {fmt_count(row['running_median'])} and peaked at "
            f"{fmt_count(row['running_max'])}{of_cap}; waiting peaked at {fmt_count(row['waiting_max'])}."
        )
    if row["kv_max_pct"] is not None:
        parts.append(
            f"KV use had a median of {fmt_pct(row['kv_median_pct'])} and peaked at "
            f"{fmt_pct(row['kv_max_pct'])}."
        )
    if row["preemptions"]:
        parts.append(f"{fmt_count(row['preemptions'])} preemptions.")
    return " ".join(parts)


def interference_table(roles: Sequence[Mapping[str, Any]], experiments: Mapping[str, str]) -> str:
    """Role rows of every interference run (`experiments`: run id -> experiment)."""
    body = [
        [experiments[r["run_id"]], r["role"], f"{r['n']:,}", f"{r['n_failed']:,}", fmt_ms(r["ttft_p50_ms"]),
         fmt_ms(r["ttft_p90_ms"]), fmt_ms(r["itl_p50_ms"]), fmt_ms(r["itl_p99_ms"])]
        for r in roles if r["run_id"] in experiments
    ]
    return html_table(["run", "role", "n", "failed", "TTFT p50", "TTFT p90", "ITL p50", "ITL p99"], body)


def sweep_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """`rows`: concurrency, n_requests, n_failed, run_rates columns and request_path's
    queue_share (absent or None: the server sent no timings), by concurrency."""
    body = (
        [str(r["concurrency"]), f"{r['n_requests']:,}", f"{r['n_failed']:,}", fmt_ms(r["ttft_p50_ms"]),
         fmt_ms(r["ttft_p95_ms"]), fmt_count(r["tok_s_per_request"]), fmt_count(r["total_tok_s"]),
         _reported_share(r.get("queue_share"))]
        for r in rows
    )
    return html_table(
        ["concurrency", "requests", "failed", "TTFT p50", "TTFT p95", "tok/s per request", "total tok/s",
         "vLLM's queue share of TTFT"], body
    )


def _reported_share(v: float | None) -> str:
    return NOT_REPORTED if v is None else fmt_share(v)


# --- the request path (filledfirst.analysis.request_path) ------------------------------------


def ttft_parts_sentence(rows: Sequence[Mapping[str, Any]]) -> str:
    """What the run's TTFT-parts chart rests on, or why there is none (`rows`:
    request_path.ttft_parts of one run)."""
    roles = {r["role"]: r for r in rows}  # n_ok and n_timed are per role
    untimed = [role for role, r in roles.items() if not r["n_timed"]]
    if not roles:
        return "TTFT parts: no request succeeded."
    if len(untimed) == len(roles):
        return f"TTFT parts (server queue, server prefill): {NOT_REPORTED}."
    timed = sum(r["n_timed"] for r in roles.values())
    ok = sum(r["n_ok"] for r in roles.values())
    text = f"TTFT parts from vLLM's per-request timings of {timed:,} of {ok:,} successful requests."
    if untimed:
        text += f" {', '.join(untimed)}: {NOT_REPORTED}."
    return text


def request_check_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Our TTFT from send against vLLM's queue + prefill of the same request, per run (`rows`:
    request_path.against_server): their difference, the front end and transport, as a
    distribution."""
    body = []
    for r in rows:
        if not r["n_timed"]:
            body.append([r["run_id"], f"0 of {r['n_ok']:,}", NOT_REPORTED, "", "", ""])
            continue
        body.append([
            r["run_id"], f"{r['n_timed']:,} of {r['n_ok']:,}",
            " / ".join(fmt_ms(r[f"front_end_p{q}_ms"]) for q in (50, 90, 99)) + f" / {fmt_ms(r['front_end_max_ms'])}",
            fmt_share(r["server_share_p50"]), f"{r['n_server_longer']:,}",
            "yes" if r["n_server_longer"] == 0 else "NO",
        ])
    return html_table(
        ["run", "requests with vLLM's timings", "ours from send - vLLM's queue + prefill: p50 / p90 / p99 / max",
         "vLLM's share of ours (median request)", "vLLM's longer than ours", "consistent"],
        body,
    )


SEED_PATTERNS = {  # the seed's side-by-side table: case -> (what is happening, main clue)
    "reference": ("same workload at lower offered load",
                  "TTFT low, KV low, model execution well below limit"),
    "prefill-decode interference": ("long prefill affects request classes differently",
                                    "new-arrival TTFT spikes; requests already decoding much less affected"),
    "active-sequence limit": ("requests in model execution approaches max_num_seqs",
                              "model execution near limit while KV has room"),
    "KV-capacity pressure": ("request state fills available KV cache",
                             "KV near full and waiting grows despite sequence headroom"),
}


def patterns_table(diagnosis: Sequence[Mapping[str, Any]]) -> str:
    """The seed's patterns table with our runs: designed-for pattern, measured label, clue."""
    body = []
    for d in diagnosis:
        expect = d.get("expect") or ""
        what = SEED_PATTERNS.get(d["label"], ("", ""))[0]
        verdict = "" if not expect else ("as designed" if expect == d["label"] else f"designed for {expect}")
        body.append([d["experiment"], d["label"], verdict, what, d.get("clue") or "", d.get("warnings") or ""])
    return html_table(["run", "what filled first", "", "what is happening (seed)", "measured clue", "warnings"], body)


def fmt_share(v: float | None) -> str:
    """A 0-1 share as a whole percentage."""
    return "n/a" if v is None else f"{100 * v:.0f} %"


def evidence_intro(rules: DiagnosisRules) -> str:
    """What the evidence table's columns are, with the thresholds the labels were made with."""
    return para(
        f"The evidence: the loaded window (arrivals of sent requests after a {fmt_share(rules.warmup_frac)} "
        f"warm-up, drain excluded, ending at the last scrape) and how much of it the scrapes cover (a "
        f"value stands for at most {rules.scrape_hold_factor:g}x the scrape interval; no label below "
        f"{fmt_share(rules.min_scrape_coverage)}); its shares with running at the cap (>= "
        f"{fmt_share(rules.cap_frac)} of max_num_seqs per engine), a queue, and KV at or above "
        f"{rules.kv_full_pct:g} %; where the server reports per-request timings, its queue's share of the "
        f"TTFT of the requests arriving in the window (either limit needs >= "
        f"{fmt_share(rules.queue_min_ttft_share)}); when each limit first crossed; Little's law (the server's mean "
        "running + waiting over the client's mean requests in flight); goodput (requests meeting "
        f"TTFT <= {rules.slo_ttft_ms:g} ms and no gap between tokens above {rules.slo_itl_ms:g} ms, per "
        "second: the offered load times the share that met them; failed ones never); and the KV "
        "ledger (bytes per token from vLLM's KV memory and tokens, else from the model's config; the "
        "capacity vLLM reported, and how many requests of this workload's mean length fit).")


def evidence_table(diagnosis: Sequence[Mapping[str, Any]], rules: DiagnosisRules) -> str:
    """The numbers behind each label: loaded window, scrape coverage, shares, first
    crossings, Little's law, goodput and the KV ledger (seed 004)."""
    body = []
    for d in diagnosis:
        ratio = d.get("littles_ratio")
        little = "n/a" if ratio is None else f"{ratio:.2f}" + ("" if d.get("littles_ok") else " (mismatch)")
        fit = d.get("kv_fit_concurrency")
        ledger = (
            f"{fmt_count(d.get('kv_bytes_per_token'))} B/token, {fmt_count(d.get('kv_capacity_tokens'))} tokens, "
            f"fits {fit:,.0f} at this workload's mean length" if fit is not None else "n/a"
        )
        goodput = d.get("goodput_rps")
        body.append([
            d["experiment"], f"{fmt_s(d.get('window_start_s'))} to {fmt_s(d.get('window_end_s'))}",
            fmt_share(d.get("scrape_coverage")), fmt_share(d.get("running_at_cap_share")),
            fmt_share(d.get("waiting_share")), fmt_share(d.get("kv_full_share")),
            _reported_share(d.get("window_queue_share")) if d.get("window_timed") else NOT_REPORTED,
            d.get("first_crossings") or "", little,
            "n/a" if goodput is None else f"{goodput:.2f} req/s ({fmt_share(d.get('slo_met_share'))} met the SLO)",
            ledger,
        ])
    return html_table(
        ["run", "loaded window", "scrape coverage", "at the cap", "waiting", f"KV >= {rules.kv_full_pct:g} %",
         "vLLM's queue share of TTFT", "first crossings",
         "Little's law L / λW", "goodput", "KV ledger"],
        body,
    )
