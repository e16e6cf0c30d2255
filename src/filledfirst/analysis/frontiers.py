"""Table `frontiers`: one row per (frontier, setting), from the ingested probe runs.

Made after the diagnosis (`filledfirst diagnose` writes both), from what is stored only:
each probe run's `frontier` block (run.json, typed: filledfirst.contracts.runmeta.FrontierProbe),
its `diagnosis` row, its rates (`signals.run_rates`) and the search's search.json (`frontier_searches`, when it
was ingested; without it the bracket is read off the probes: lo the highest rate that
held below the lowest that broke). When a probe was measured more than once (a search
resumed after a failure) its latest run counts.

Columns:
- frontier, setting, workload, slo_ttft_ms, slo_itl_ms, target, probes (runs counted),
  reason and error (the search's stop reason and a failed probe's reason; NULL without
  search.json);
- the knee's interval: floor_rps (the lowest capacity the held lo vouches for,
  filledfirst.frontier.verdict.interval_floor), confidence (of each verdict's attainment
  interval), hi_inconclusive (hi never showed a verdict and counts as broken);
- the capacity estimate and the drift check (NULL when the search grew from `start`):
  estimate_rps (the closed loop's completions per second at max_num_seqs, the first
  rate), drift_start_rps and drift_end_rps (the same closed loop before and after the
  search), drift (end / start - 1) and drifted (|drift| over the search's drift_max);
- the bracket: lo_rps (highest rate that held), hi_rps (lowest that broke), each also as
  measured (`*_offered_rps`: sent requests over their arrival span), in output tokens/s
  (`*_output_tok_s`: run_rates' total_tok_s), with its attainment and goodput
  (`*_goodput_rps` = attainment x offered: requests/s meeting the frontier's SLO; the
  diagnosis' own goodput_rps uses the diagnosis SLO);
- the knee (the lowest breaking probe): knee_run_id, knee_label and knee_clue (its
  diagnosis label and clue; a probe whose requests met the SLO but whose queue grew,
  which the diagnosis calls `reference` or `unclassified` because the queue formed over
  too little of the window, is the limit that was full for more of the loaded time, the
  KV cache or the cap, or `compute-bound` with neither full; a break with no queue and no
  full resource is `ITL-bound` when more of its misses were stalls than slow first
  tokens, else `compute-bound`);
- for each scheduler signal the lowest probed rate at which it crossed (NULL: at no
  probe), from the diagnosis' loaded-window shares: waiting_from_rps (waiting > 0 some
  of the time, waiting_share > 0), cap_from_rps (running at the cap, running_at_cap_share
  > 0), kv_full_from_rps (KV >= the diagnosis' kv_full_pct, kv_full_share > 0) and
  ttft_p95_from_rps (TTFT p95 over the frontier's TTFT SLO);
- interventions (filledfirst.frontier.interventions, from search.json): an intervention's
  row has parent (the setting it relaxes), knob, relaxed_from and relaxed_to (ledger
  units), role (relaxed: the knob of the limit named at the parent's knee, IMPLICATED;
  control: the other), shift (its lo / the parent's lo - 1), min_shift (the frontier's
  interventions.min_shift), least_shift (min_shift widened by the parent search's drift,
  filledfirst.frontier.interventions.widened: the interventions run after that search, on a
  machine whose speed changed that much over it), moved (`moved`: its interval wholly
  above the parent's and its lo at least 1 + least_shift times the parent's, the same
  below, or not), within_drift (it moved by min_shift but not by least_shift: the
  drift alone could explain it) and interval_move (the same as moved by the intervals
  alone, with no least shift); the parent's row has verdict (`confirmation`),
  verdict_why and next_label (what filled first at the relaxed knee).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from filledfirst.analysis import numbers, signals
from filledfirst.analysis.diagnosis.labels import Label
from filledfirst.analysis.diagnosis.storage import stored_rules
from filledfirst.contracts.runmeta import FrontierProbe
from filledfirst.contracts.search import Knob, SearchRecord
from filledfirst.errors import UserError
from filledfirst.frontier.interventions import Span, lo_ratio, move, widened
from filledfirst.store.tables import table_exists
from filledfirst.study import DiagnosisRules

SCHEMA = {
    "frontier": pl.String, "setting": pl.String, "workload": pl.String,
    "slo_ttft_ms": pl.Float64, "slo_itl_ms": pl.Float64, "target": pl.Float64, "probes": pl.Int64,
    "reason": pl.String, "error": pl.String,
    "floor_rps": pl.Float64, "confidence": pl.Float64, "hi_inconclusive": pl.Boolean,
    "estimate_rps": pl.Float64, "drift_start_rps": pl.Float64, "drift_end_rps": pl.Float64,
    "drift": pl.Float64, "drifted": pl.Boolean,
    "lo_rps": pl.Float64, "hi_rps": pl.Float64, "lo_offered_rps": pl.Float64, "hi_offered_rps": pl.Float64,
    "lo_output_tok_s": pl.Float64, "hi_output_tok_s": pl.Float64,
    "lo_attainment": pl.Float64, "hi_attainment": pl.Float64, "lo_goodput_rps": pl.Float64,
    "hi_goodput_rps": pl.Float64, "lo_run_id": pl.String,
    "knee_run_id": pl.String, "knee_label": pl.String, "knee_clue": pl.String,
    "waiting_from_rps": pl.Float64, "cap_from_rps": pl.Float64, "kv_full_from_rps": pl.Float64,
    "ttft_p95_from_rps": pl.Float64,
    "parent": pl.String, "knob": pl.String, "relaxed_from": pl.Int64, "relaxed_to": pl.Int64, "min_shift": pl.Float64,
    "least_shift": pl.Float64, "role": pl.String, "shift": pl.Float64, "moved": pl.String, "within_drift": pl.Boolean,
    "interval_move": pl.String,
    "verdict": pl.String, "verdict_why": pl.String, "next_label": pl.String,
}


class Confirmation(StrEnum):
    """Did relaxing what filled first move the knee, and the control not?"""

    CONFIRMED = "confirmed"
    NOT_CONFIRMED = "not confirmed"
    INCONCLUSIVE = "inconclusive"


class Role(StrEnum):
    RELAXED = "relaxed"  # relaxes the limit named at its parent's knee
    CONTROL = "control"  # relaxes the other one by the same factor


# The knee's label -> the knob that relaxes the limit it names (frontier.interventions).
IMPLICATED = {Label.SEQ_LIMIT: Knob.SEQS, Label.KV_PRESSURE: Knob.KV, Label.PREFIX_EVICTION: Knob.KV}


def _span(row: Mapping[str, Any]) -> Span | None:
    """A row's knee (filledfirst.frontier.interventions.Span), None when the search measured
    no knee (it failed)."""
    return Span.measured(row.get("lo_rps"), row.get("hi_rps"), row.get("floor_rps"), row.get("reason"))


def knee_span(row: Mapping[str, Any]) -> tuple[float, float] | None:
    """A row's knee interval [floor, hi) (hi infinite when nothing broke, floor 0 when
    start broke; floor lo itself without an interval), None when the search measured no
    knee (it failed)."""
    span = _span(row)
    return None if span is None else (span.floor, span.hi)


def moved(before: Mapping[str, Any], after: Mapping[str, Any], min_shift: float = 0.0) -> str | None:
    """Whether after's knee moved from before's (filledfirst.frontier.interventions.move:
    'up', 'down' or 'no'), None when either has no interval."""
    a, b = _span(before), _span(after)
    return None if a is None or b is None else str(move(a, b, min_shift))


def confirmation(label: str | None, relaxed: Mapping[str, Any] | None,
                 control: Mapping[str, Any] | None) -> tuple[Confirmation | None, str]:
    """The verdict on a knee's label from its two interventions' `moved`, `within_drift`,
    `interval_move`, `shift`, `least_shift` and `knee_label` (None: the label names no limit
    an intervention relaxes), and why.

    A knee moves when its interval clears the parent's and it moved by the least shift that
    counts (`moved`); that least shift guards against the noise between two searches. A
    relaxed knee that cleared the parent's interval by less is still a confirmation when the
    other limit filled first at it (`next_limit`): the limit relaxed no longer fills first,
    which is what relaxing it must do, and how far the knee could move was set by how close
    the next limit was, not by noise. That case asks more of the control: not above the
    parent's interval even by the intervals alone."""
    if label not in IMPLICATED:
        return None, f"the knee names no limit to relax ({label or 'no label'})"
    relaxed, control = relaxed or {}, control or {}
    r, c = relaxed.get("moved"), control.get("moved")
    knob = IMPLICATED[label]
    if r is None:
        return Confirmation.INCONCLUSIVE, "the relaxed search measured no knee"
    if (r != "up" and relaxed.get("interval_move") == "up" and control.get("interval_move") not in (None, "up")
            and (after := next_limit(label, relaxed))):
        return Confirmation.CONFIRMED, (
            f"relaxing {knob} moved the knee {_pct_shift(relaxed)}, above its interval, until the {after} "
            f"filled first (the next limit close behind: less than the {_share(relaxed.get('least_shift'))} a "
            "move needs otherwise); the control did not move it above its interval")
    if r != "up":
        shift, least = relaxed.get("shift"), relaxed.get("least_shift")
        if relaxed.get("within_drift"):
            return Confirmation.INCONCLUSIVE, (f"relaxing {knob} moved the knee {_pct_shift(relaxed)}, beyond "
                                               f"{_share(relaxed.get('min_shift'))} but not beyond the "
                                               f"{_share(least)} the server's drift allows")
        if shift is None or least is None or not 0 < shift < least:
            return Confirmation.NOT_CONFIRMED, f"relaxing {knob} did not move the knee above its interval"
        why = f"relaxing {knob} moved the knee {_pct_shift(relaxed)}, less than the {_share(least)} that counts"
        after = relaxed.get("knee_label")
        if after and after != label:
            # What filled first changed: the next limit is close behind the first one.
            why += f"; at the new knee the {after} filled first"
        return Confirmation.NOT_CONFIRMED, why
    if c is None:
        return Confirmation.INCONCLUSIVE, "the knee moved, but the control measured no knee"
    if c != "no":
        return Confirmation.INCONCLUSIVE, f"the knee moved, and the control moved it too ({c})"
    why = f"relaxing {knob} moved the knee above its interval; the control did not"
    if control.get("within_drift"):
        why += (f" (it moved {_pct_shift(control)}, within the {_share(control.get('least_shift'))} "
                "the server's drift allows)")
    return Confirmation.CONFIRMED, why


def next_limit(label: str, relaxed: Mapping[str, Any]) -> Label | None:
    """The other limit, where it filled first at the relaxed knee (None: the same limit, no
    limit or no label there)."""
    try:
        after = Label(relaxed.get("knee_label"))
    except ValueError:
        return None
    return after if after in IMPLICATED and IMPLICATED[after] != IMPLICATED[label] else None


def _pct_shift(row: Mapping[str, Any]) -> str:
    return numbers.change(row.get("shift"), "by an unknown share")


def _share(x: float | None) -> str:
    return numbers.share(x, "an unknown share")


def _interventions(rows: list[dict]) -> None:
    """Fill in the intervention columns: an intervention's role, shift and move against its
    parent; a parent's verdict and what filled first at its relaxed knee."""
    by_setting = {(r["frontier"], r["setting"]): r for r in rows}
    for r in rows:
        parent = by_setting.get((r["frontier"], r["parent"])) if r["parent"] else None
        if parent is None:
            continue
        implicated = IMPLICATED.get(parent.get("knee_label"))
        r["role"] = None if implicated is None else (Role.RELAXED if r["knob"] == implicated else Role.CONTROL)
        least = r["least_shift"] = widened(r.get("min_shift") or 0.0, parent.get("drift"))
        r["moved"] = moved(parent, r, least)
        if r["moved"] is not None:
            r["within_drift"] = r["moved"] == "no" and moved(parent, r, r.get("min_shift") or 0.0) != "no"
            r["interval_move"] = moved(parent, r)
        if (ratio := lo_ratio(parent.get("lo_rps"), r.get("lo_rps"))) is not None:
            r["shift"] = ratio - 1
    for p in rows:
        mine = [r for r in rows if r["frontier"] == p["frontier"] and r["parent"] == p["setting"]]
        if not mine:
            continue
        relaxed = next((r for r in mine if r["role"] == Role.RELAXED), None)
        control = next((r for r in mine if r["role"] == Role.CONTROL), None)
        verdict, p["verdict_why"] = confirmation(p.get("knee_label"), relaxed, control)
        p["verdict"] = verdict.value if verdict else None
        if relaxed is not None:
            p["next_label"] = relaxed.get("knee_label") or ("nothing broke" if relaxed.get("lo_rps") else None)



class NoQueueLabel(StrEnum):
    """A knee's own label where the diagnosis found no queue and nothing full."""

    ITL_BOUND = "ITL-bound"
    COMPUTE_BOUND = "compute-bound"


@dataclass(frozen=True)
class ProbeRun:
    """A probe's run as the frontier tables read it."""

    run_id: str
    status: str
    workload: str | None
    probe: FrontierProbe  # its run.json block


def probe_runs(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, str], list[ProbeRun]]:
    """(frontier, setting) -> its probe runs, latest run per probe, in probe order."""
    latest: dict[tuple[str, str, int], ProbeRun] = {}
    for run_id, meta in signals.run_metas(con).items():  # ordered by started_at
        f = meta.frontier
        if f:
            latest[(f.name, f.setting, f.probe)] = ProbeRun(run_id, meta.status, meta.workload, f)
    out: dict[tuple[str, str], list[ProbeRun]] = {}
    for (name, setting, _), run in sorted(latest.items()):
        out.setdefault((name, setting), []).append(run)
    return out


def _knee_label(d: dict, probe: FrontierProbe, rules: DiagnosisRules) -> tuple[str | None, str | None]:
    label, clue = d.get("label"), d.get("clue")
    ws, cap, kvf = d.get("waiting_share"), d.get("running_at_cap_share"), d.get("kv_full_share")
    if label not in (Label.REFERENCE, Label.UNCLASSIFIED) or ws is None or ws >= rules.waiting_min_share:
        return label, clue
    if _broke_on_backlog(probe):
        # Its requests met the SLO; it broke because its queue grew. That queue forms over the
        # probe's last part, so it is in too little of the loaded window for the experiments'
        # shares, and the limit that was full while it grew is what filled first.
        full = {Label.KV_PRESSURE: kvf or 0.0, Label.SEQ_LIMIT: cap or 0.0}
        limit = max(full, key=full.get)
        why = (f"its requests met the SLO but its queue grew {probe.backlog_growth:.3g} s/s (waiting {ws:.0%} "
               f"of the time), while running at the cap {_pct(cap)} and KV full {_pct(kvf)} of the loaded time")
        if full[limit] > 0:
            return limit.value, f"{why}: it queued behind the {'KV cache' if limit is Label.KV_PRESSURE else 'cap'}"
        return NoQueueLabel.COMPUTE_BOUND, f"{why}: it queued with neither limit full"
    if ((cap is not None and cap >= rules.seq_limit_min_cap_share)
            or (kvf is not None and kvf >= rules.kv_full_min_share)):
        return label, clue
    missed = probe.missed or {}
    itl, ttft, failed = missed.get("itl", 0), missed.get("ttft", 0), missed.get("failed", 0)
    own = NoQueueLabel.ITL_BOUND if itl > ttft else NoQueueLabel.COMPUTE_BOUND
    return own, (f"SLO broken with no queue (waiting {ws:.0%} of the time) and no full resource "
                 f"(running at cap {_pct(cap)}, KV full {_pct(kvf)}): of {probe.requests} requests "
                 f"{itl} over the ITL SLO, {ttft} over the TTFT SLO, {failed} failed")


def _pct(share: float | None) -> str:
    return "unknown" if share is None else f"{share:.0%}"


def _broke_on_backlog(probe: FrontierProbe) -> bool:
    """The probe broke while its attainment alone would have held it: its backlog grew."""
    return (probe.held is False and probe.backlog_growth is not None and probe.backlog_growth > 0
            and probe.attainment_lo is not None and probe.target is not None and probe.attainment_lo >= probe.target)


def _interval(search: SearchRecord | None) -> dict:
    """The knee's interval, estimate and drift columns of a search (None without search.json)."""
    result = search.result if search else None
    drift = search.drift if search else None
    return {"floor_rps": result.floor if result else None, "confidence": result.confidence if result else None,
            "hi_inconclusive": result.hi_inconclusive if result else None,
            "estimate_rps": search.estimate_rps if search else None,
            "drift_start_rps": drift.start_rps if drift else None, "drift_end_rps": drift.end_rps if drift else None,
            "drift": drift.change if drift else None, "drifted": drift.drifted if drift else None,
            **_relaxation(search)}


def _relaxation(search: SearchRecord | None) -> dict:
    """What an intervention relaxes (all None for a setting of the config)."""
    i = search.intervention if search else None
    return {"parent": i.parent if i else None, "knob": i.knob.value if i else None,
            "relaxed_from": i.before if i else None, "relaxed_to": i.after if i else None,
            "min_shift": i.min_shift if i else None}


def frontier_table(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    if not table_exists(con, "diagnosis"):
        raise UserError("no diagnosis table (run `filledfirst diagnose` first)")
    rules = stored_rules(con)
    groups = probe_runs(con)
    if not groups:
        return pl.DataFrame([], schema=SCHEMA)
    diag = {d["run_id"]: d for d in pl.from_arrow(con.sql("SELECT * FROM diagnosis").to_arrow_table()).to_dicts()}
    rates = {r["run_id"]: r for r in signals.run_rates(con).to_dicts()}
    searches: dict[tuple[str, str], SearchRecord] = {}  # each ingested search's search.json
    if table_exists(con, "frontier_searches"):
        searches = {(f, s): SearchRecord.loads(doc, f"table frontier_searches, row {f}/{s}")
                    for f, s, doc in con.execute("SELECT frontier, setting, search FROM frontier_searches").fetchall()}
    rows = []
    for (name, setting), probes in groups.items():
        measured = [p for p in probes if p.probe.attainment is not None]
        search = searches.get((name, setting))
        result = search.result if search is not None else None
        if result is not None:
            lo, hi = result.lo, result.hi
        else:
            broke = [p.probe.rate for p in measured if not p.probe.held]
            hi = min(broke, default=None)
            lo = max((p.probe.rate for p in measured if p.probe.held and (hi is None or p.probe.rate < hi)),
                     default=None)
        lo_p = next((p for p in reversed(measured) if lo is not None and p.probe.rate == lo and p.probe.held), None)
        hi_p = next((p for p in measured if hi is not None and p.probe.rate == hi and not p.probe.held), None)
        slo = probes[0].probe.slo
        row = {"frontier": name, "setting": setting, "workload": probes[0].workload,
               "slo_ttft_ms": slo.ttft_ms, "slo_itl_ms": slo.itl_ms, "target": probes[0].probe.target,
               "probes": len(probes), "reason": result.reason.value if result else None,
               "error": result.error if result else None, "lo_rps": lo, "hi_rps": hi,
               **_interval(search)}
        for side, p in (("lo", lo_p), ("hi", hi_p)):
            r = rates.get(p.run_id, {}) if p else {}
            offered = r.get("offered_rps")
            row[f"{side}_offered_rps"] = offered
            row[f"{side}_output_tok_s"] = r.get("total_tok_s")
            row[f"{side}_attainment"] = p.probe.attainment if p else None
            row[f"{side}_goodput_rps"] = p.probe.attainment * offered if p and offered is not None else None
        row["lo_run_id"] = lo_p.run_id if lo_p else None
        if hi_p is not None:
            row["knee_run_id"] = hi_p.run_id
            row["knee_label"], row["knee_clue"] = _knee_label(diag.get(hi_p.run_id, {}), hi_p.probe, rules)

        def lowest(crossed) -> float | None:
            return min((p.probe.rate for p in measured if crossed(diag.get(p.run_id, {}), rates.get(p.run_id, {}))),
                       default=None)

        row["waiting_from_rps"] = lowest(lambda d, r: (d.get("waiting_share") or 0) > 0)
        row["cap_from_rps"] = lowest(lambda d, r: (d.get("running_at_cap_share") or 0) > 0)
        row["kv_full_from_rps"] = lowest(lambda d, r: (d.get("kv_full_share") or 0) > 0)
        row["ttft_p95_from_rps"] = lowest(
            lambda d, r: r.get("ttft_p95_ms") is not None and r["ttft_p95_ms"] > slo.ttft_ms)
        rows.append(row)
    _interventions(rows)
    return pl.DataFrame(rows, schema=SCHEMA)


def write_frontiers(db_path: str | Path) -> pl.DataFrame:
    """Store `frontier_table` as table `frontiers` (empty for a study without searches)."""
    from filledfirst.store.ingest import edited_copy

    with edited_copy(db_path) as con:
        df = frontier_table(con)
        con.register("_frontiers_new", df.to_arrow())
        con.execute("CREATE OR REPLACE TABLE frontiers AS SELECT * FROM _frontiers_new")
        con.unregister("_frontiers_new")
    return df
