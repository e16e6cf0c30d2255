"""The diagnosis in the report: the seed's patterns table with our runs, and the evidence
behind each label with the thresholds it was made with."""

from __future__ import annotations

from collections.abc import Sequence

from filledfirst.analysis import numbers
from filledfirst.analysis.diagnosis.labels import Label
from filledfirst.contracts.diagnosis import DiagnosisRow
from filledfirst.engines import ENGINES
from filledfirst.report.markup import html_table, para
from filledfirst.report.tables import NOT_REPORTED, reported_share
from filledfirst.study import DiagnosisRules

SEED_PATTERNS = {  # the seed's side-by-side table: case -> (what is happening, main clue)
    Label.REFERENCE: ("same workload at lower offered load",
                  "TTFT low, KV low, model execution well below limit"),
    Label.INTERFERENCE: ("long prefill affects request classes differently",
                                    "new-arrival TTFT spikes; requests already decoding much less affected"),
    Label.SEQ_LIMIT: ("requests in model execution approaches max_num_seqs",
                              "model execution near limit while KV has room"),
    Label.KV_PRESSURE: ("request state fills available KV cache",
                             "KV near full and waiting grows despite sequence headroom"),
    # not one of the seed's: what its unlabelled replays showed, named (filledfirst's row)
    Label.TOKEN_BUDGET: ("long prompts take the per-step token budget chunk by chunk",
                         "requests wait while steps use the whole budget, cap and KV with room"),
    Label.PREFIX_EVICTION: ("full KV evicts the cached prefixes the traffic shares",
                            "cache hits fall far below the trace's reuse while KV is full and requests wait"),
    Label.COMPUTE: ("the engine's steps are the limit (the seed: prefill is compute-bound)",
                    "requests wait for the step in flight with slots, blocks and budget to spare"),
}


def patterns_table(diagnosis: Sequence[DiagnosisRow]) -> str:
    """The seed's patterns table with our runs: designed-for pattern, measured label, clue."""
    body = []
    for d in diagnosis:
        expect = d.expect or ""
        what = SEED_PATTERNS.get(d.label, ("", ""))[0]
        verdict = "" if not expect else ("as designed" if expect == d.label else f"designed for {expect}")
        body.append([d.experiment, d.label, verdict, what, d.clue or "", d.warnings or ""])
    return html_table(["run", "what filled first", "", "what is happening (seed)", "measured clue", "warnings"], body)


def engines_cannot(rows: Sequence[DiagnosisRow]) -> list[str]:
    """A paragraph per engine that served runs here and whose metrics leave something
    out: what, and so which labels its runs could not be given."""
    out = []
    for engine in ENGINES:
        runs = [d.experiment for d in rows if d.engine == engine.name]
        if engine.cannot and runs:
            shown = ", ".join(runs[:6]) + (f" and {len(runs) - 6} more" if len(runs) > 6 else "")
            out.append(para(
                f"{engine.name}'s metrics do not tell {'; '.join(engine.cannot)}: a label that needs them is not "
                f"given to its runs ({shown})."))
    return out


def evidence_intro(rules: DiagnosisRules) -> str:
    """What the evidence table's columns are, with the thresholds the labels were made with."""
    return para(
        f"The evidence: the loaded window (arrivals of sent requests after a {numbers.share(rules.warmup_frac)} "
        f"warm-up, drain excluded, ending at the last scrape) and how much of it the scrapes cover (a "
        f"value stands for at most {rules.scrape_hold_factor:g}x the scrape interval; no label below "
        f"{numbers.share(rules.min_scrape_coverage)}); its shares with running at the cap (>= "
        f"{numbers.share(rules.cap_frac)} of max_num_seqs per engine), a queue, and KV at or above "
        f"{rules.kv_full_pct:g} %; where the server reports per-request timings, its queue's share of the "
        f"TTFT of the requests arriving in the window (the requests queued at >= "
        f"{numbers.share(rules.queue_min_ttft_share)}; without timings, a queue >= "
        f"{numbers.share(rules.waiting_min_share)} of the time); what held the waiting requests, scrape by scrape in "
        "the scheduler's order, as shares of the request-seconds of waiting the scrapes saw (the label is the "
        "largest); when each limit first crossed; Little's law (the server's mean "
        "running + waiting over the client's mean requests in flight); goodput (requests meeting "
        f"TTFT <= {rules.slo_ttft_ms:g} ms and no gap between tokens above {rules.slo_itl_ms:g} ms, per "
        "second: the offered load times the share that met them; failed ones never); and the KV "
        "ledger (bytes per token from vLLM's KV memory and tokens, else from the model's config; the "
        "capacity vLLM reported, and how many requests of this workload's mean length fit).")


def evidence_table(diagnosis: Sequence[DiagnosisRow], rules: DiagnosisRules) -> str:
    """The numbers behind each label: loaded window, scrape coverage, shares, first
    crossings, Little's law, goodput and the KV ledger (seed 004)."""
    body = []
    for d in diagnosis:
        ratio = d.littles_ratio
        little = "n/a" if ratio is None else f"{ratio:.2f}" + ("" if d.littles_ok else " (mismatch)")
        fit = d.kv_fit_concurrency
        ledger = (
            f"{numbers.count(d.kv_bytes_per_token)} B/token, "
            f"{numbers.count(d.kv_capacity_tokens)} tokens, "
            f"fits {fit:,.0f} at this workload's mean length" if fit is not None else "n/a"
        )
        goodput = d.goodput_rps
        body.append([
            d.experiment, f"{numbers.seconds(d.window_start_s)} to {numbers.seconds(d.window_end_s)}",
            numbers.share(d.scrape_coverage), numbers.share(d.running_at_cap_share),
            numbers.share(d.waiting_share), numbers.share(d.kv_full_share),
            reported_share(d.window_queue_share) if d.window_timed else NOT_REPORTED,
            d.bound or "nothing a scrape saw waiting", d.first_crossings or "", little,
            "n/a" if goodput is None else f"{goodput:.2f} req/s ({numbers.share(d.slo_met_share)} met the SLO)",
            ledger,
        ])
    return html_table(
        ["run", "loaded window", "scrape coverage", "at the cap", "waiting", f"KV >= {rules.kv_full_pct:g} %",
         "the server's queue share of TTFT", "what held the waiting", "first crossings",
         "Little's law L / λW", "goodput", "KV ledger"],
        body,
    )
