"""Table `frontiers`: one row per (frontier, setting), from the ingested probe runs.

Made after the diagnosis (`filledfirst diagnose` writes both), from what is stored only:
each probe run's `frontier` block (run.json, typed: filledfirst.contracts.runmeta.FrontierProbe),
its `diagnosis` row, its rates (`signals.run_rates`) and the search's search.json (`frontier_searches`, when it
was ingested; without it the bracket is read off the probes: lo the highest rate that
held below the lowest that broke). When a probe was measured more than once (a search
resumed after a failure) its latest run counts. Its rows are records
(filledfirst.contracts.frontiers.FrontierRow, an intervention's with its Intervention), never
changed in place: comparing an intervention with its parent makes a new row; stored flat.

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
  alone, with no least shift), predicted_shift (the move the parent's prediction gives
  the relaxation; predicted_shift_doubled: a doubling's, where it relaxes further), and
  with interventions.paired its paired check
  (filledfirst.frontier.paired): paired_verdict, paired_shift (relaxed over parent,
  side by side, the pairs' geometric mean), paired_shift_lo and paired_shift_hi (the
  lowest and highest pair's), paired_why, paired_concurrency (its closed loop) and
  predicted_paired_shift (the parent's prediction of that shift); the parent's row has verdict
  (`confirmation`, from the paired checks where both interventions have one),
  verdict_why and next_label (what filled first at the relaxed knee);
- the prediction (filledfirst.analysis.prediction; NULL without a step model or an
  answered request): predicted_rps and predicted_first (the first limit's knee and the
  limit), predicted_next and predicted_next_rps (the next), each limit's knee
  (predicted_cap_rps, predicted_kv_rps, predicted_budget_rps, predicted_compute_rps,
  predicted_itl_rps), model_scope (the setting's own step model, or its engine's),
  predicted_ratio (the measured knee, the geometric mean of lo and hi, over predicted_rps)
  and would_take (the cheapest single change predicted to move the knee by the least
  shift that counts, interventions.min_shift).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import polars as pl

from filledfirst.analysis import numbers, prediction, signals
from filledfirst.analysis.diagnosis.labels import Label
from filledfirst.analysis.diagnosis.rules import LABELLED, Meaning, labelled
from filledfirst.analysis.diagnosis.storage import stored_rules
from filledfirst.contracts.diagnosis import DiagnosisRow
from filledfirst.contracts.frontiers import Confirmation, FrontierRow, Intervention, Role
from filledfirst.contracts.runmeta import FrontierProbe, RunMeta
from filledfirst.contracts.search import Knob, SearchRecord, Slo, StopReason
from filledfirst.errors import UserError
from filledfirst.frontier import paired
from filledfirst.frontier.interventions import Span, lo_ratio, move, widened
from filledfirst.schema import schema_default
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
    "interval_move": pl.String, "predicted_shift": pl.Float64, "predicted_shift_doubled": pl.Float64,
    "paired_verdict": pl.String,
    "paired_shift": pl.Float64, "paired_shift_lo": pl.Float64, "paired_shift_hi": pl.Float64, "paired_why": pl.String,
    "paired_concurrency": pl.Int64, "predicted_paired_shift": pl.Float64,
    "predicted_rps": pl.Float64, "predicted_first": pl.String, "predicted_next": pl.String,
    "predicted_next_rps": pl.Float64, "predicted_cap_rps": pl.Float64, "predicted_kv_rps": pl.Float64,
    "predicted_budget_rps": pl.Float64, "predicted_compute_rps": pl.Float64, "predicted_itl_rps": pl.Float64,
    "model_scope": pl.String, "predicted_ratio": pl.Float64, "would_take": pl.String,
    "verdict": pl.String, "verdict_why": pl.String, "next_label": pl.String,
}


# The knee's label -> the knob that relaxes the limit it names (frontier.interventions), from its rule.
IMPLICATED: dict[Label, Knob] = {label: rule.knob for label, rule in LABELLED.items() if rule.knob is not None}


def _span(row: FrontierRow) -> Span | None:
    """A row's knee (filledfirst.frontier.interventions.Span), None when the search measured
    no knee (it failed)."""
    return Span.measured(row.lo_rps, row.hi_rps, row.floor_rps, row.reason)


def knee_span(row: FrontierRow) -> tuple[float, float] | None:
    """A row's knee interval [floor, hi) (hi infinite when nothing broke, floor 0 when
    start broke; floor lo itself without an interval), None when the search measured no
    knee (it failed)."""
    span = _span(row)
    return None if span is None else (span.floor, span.hi)


def moved(before: FrontierRow, after: FrontierRow, min_shift: float = 0.0) -> str | None:
    """Whether after's knee moved from before's (filledfirst.frontier.interventions.move:
    'up', 'down' or 'no'), None when either has no interval."""
    a, b = _span(before), _span(after)
    return None if a is None or b is None else str(move(a, b, min_shift))


_NOT_COMPARED = Intervention(parent="", knob="")  # a missing intervention: nothing moved


def unsearched(row: FrontierRow | None) -> bool:
    """An intervention its paired check alone judges (interventions.search false): no knee."""
    return row is not None and row.reason == StopReason.NOT_SEARCHED


def confirmation(label: str | None, relaxed: FrontierRow | None,
                 control: FrontierRow | None) -> tuple[Confirmation | None, str]:
    """The verdict on a knee's label from its two interventions' `moved`, `within_drift`,
    `interval_move`, `shift`, `least_shift` and `knee_label` (None: the label names no limit
    an intervention relaxes), and why.

    A knee moves when its interval clears the parent's and it moved by the least shift that
    counts (`moved`); that least shift guards against the noise between two searches. A
    relaxed knee that cleared the parent's interval by less is still a confirmation when the
    other limit filled first at it (`next_limit`): the limit relaxed no longer fills first,
    which is what relaxing it must do, and how far the knee could move was set by how close
    the next limit was, not by noise. That case asks more of the control: not above the
    parent's interval even by the intervals alone. Where both interventions were also
    measured side by side with the parent, their paired checks decide instead
    (`paired_confirmation`): they do not depend on the machine's speed between searches."""
    if label not in IMPLICATED:
        return None, f"the knee names no limit to relax ({label or 'no label'})"
    ri = (relaxed.intervention if relaxed else None) or _NOT_COMPARED
    ci = (control.intervention if control else None) or _NOT_COMPARED
    if ri.paired_shift is not None and ci.paired_shift is not None:  # both paired checks measured
        return paired_confirmation(ri, ci)
    if unsearched(relaxed) or unsearched(control):
        missing = " and ".join(role for role, row, i in (("relaxed", relaxed, ri), ("control", control, ci))
                               if i.paired_shift is None)
        return Confirmation.INCONCLUSIVE, (f"no shift side by side for the {missing} (a block failed or no check "
                                           "ran), and no search of it to fall back on")
    r, c = ri.moved, ci.moved
    knob = IMPLICATED[label]
    if r is None or relaxed is None:
        return Confirmation.INCONCLUSIVE, "the relaxed search measured no knee"
    if (r != "up" and ri.interval_move == "up" and ci.interval_move not in (None, "up")
            and (after := next_limit(label, relaxed))):
        return Confirmation.CONFIRMED, (
            f"relaxing {knob} moved the knee {_pct_shift(ri)}, above its interval, until the {after} "
            f"filled first (the next limit close behind: less than the {_share(ri.least_shift)} a "
            "move needs otherwise); the control did not move it above its interval")
    if r != "up":
        shift, least = ri.shift, ri.least_shift
        if ri.within_drift:
            return Confirmation.INCONCLUSIVE, (f"relaxing {knob} moved the knee {_pct_shift(ri)}, beyond "
                                               f"{_share(ri.min_shift)} but not beyond the "
                                               f"{_share(least)} the server's drift allows")
        if shift is None or least is None or not 0 < shift < least:
            return Confirmation.NOT_CONFIRMED, f"relaxing {knob} did not move the knee above its interval"
        why = f"relaxing {knob} moved the knee {_pct_shift(ri)}, less than the {_share(least)} that counts"
        after = relaxed.knee_label
        if after and after != label:
            # What filled first changed: the next limit is close behind the first one.
            why += f"; at the new knee the {after} filled first"
        return Confirmation.NOT_CONFIRMED, why
    if c is None:
        return Confirmation.INCONCLUSIVE, "the knee moved, but the control measured no knee"
    if c != "no":
        return Confirmation.INCONCLUSIVE, f"the knee moved, and the control moved it too ({c})"
    why = f"relaxing {knob} moved the knee above its interval; the control did not"
    if ci.within_drift:
        why += (f" (it moved {_pct_shift(ci)}, within the {_share(ci.least_shift)} "
                "the server's drift allows)")
    return Confirmation.CONFIRMED, why


def paired_confirmation(relaxed: Intervention, control: Intervention) -> tuple[Confirmation, str]:
    """The verdict from both interventions' paired checks (filledfirst.frontier.paired):
    confirmed when relaxing the limit named moved the server side by side and the control
    did not, not confirmed when relaxing it did not, inconclusive otherwise."""
    both = f"{relaxed.paired_why}; the control: {control.paired_why}"
    if relaxed.paired_verdict is Confirmation.NOT_CONFIRMED:
        return Confirmation.NOT_CONFIRMED, relaxed.paired_why or ""
    if relaxed.paired_verdict is Confirmation.CONFIRMED and control.paired_verdict is Confirmation.NOT_CONFIRMED:
        return Confirmation.CONFIRMED, both
    if control.paired_verdict is Confirmation.CONFIRMED:
        return Confirmation.INCONCLUSIVE, "the control moved it too: " + both
    return Confirmation.INCONCLUSIVE, both


def next_limit(label: str, relaxed: FrontierRow) -> Label | None:
    """The other limit, where it filled first at the relaxed knee (None: the same limit, no
    limit or no label there)."""
    try:
        after = Label(relaxed.knee_label)
    except ValueError:
        return None
    return after if after in IMPLICATED and IMPLICATED[after] != IMPLICATED[label] else None


def _predicted_moves(relaxed: FrontierRow | None, control: FrontierRow | None) -> str:
    """The shifts the parent's prediction gave its interventions, beside the measured ones."""
    parts = [f"{role} {numbers.change(i.predicted_shift)}"
             + ("" if unsearched(row) else f" (measured {numbers.change(i.shift)})")
             for role, row in (("relaxed", relaxed), ("control", control))
             if row is not None and (i := row.intervention) is not None and i.predicted_shift is not None]
    return "" if not parts else "; predicted: " + ", ".join(parts)


def _pct_shift(i: Intervention) -> str:
    return numbers.change(i.shift, "by an unknown share")


def _share(x: float | None) -> str:
    return numbers.share(x, "an unknown share")


def _compared(parent: FrontierRow, r: FrontierRow, i: Intervention) -> Intervention:
    """An intervention against its parent: its role, least shift, move and shift."""
    implicated = IMPLICATED.get(parent.knee_label)
    # the parent's drift widens a knee searched after it; side by side alone, the pairs take the drift out
    least = (i.min_shift or 0.0) if unsearched(r) else widened(i.min_shift or 0.0, parent.drift)
    move_ = moved(parent, r, least)
    ratio = lo_ratio(parent.lo_rps, r.lo_rps)
    return msgspec.structs.replace(
        i, role=None if implicated is None else (Role.RELAXED if i.knob == implicated else Role.CONTROL),
        least_shift=least, moved=move_,
        within_drift=None if move_ is None else move_ == "no" and moved(parent, r, i.min_shift or 0.0) != "no",
        interval_move=None if move_ is None else moved(parent, r),
        shift=None if ratio is None else ratio - 1)


def _interventions(rows: list[FrontierRow]) -> list[FrontierRow]:
    """The rows with the intervention columns filled in: an intervention's role, shift and
    move against its parent; a parent's verdict and what filled first at its relaxed knee."""
    by_setting = {(r.frontier, r.setting): r for r in rows}
    compared = []
    for r in rows:
        parent = by_setting.get((r.frontier, r.intervention.parent)) if r.intervention else None
        if parent is not None and r.intervention is not None:
            r = msgspec.structs.replace(r, intervention=_compared(parent, r, r.intervention))
        compared.append(r)
    out = []
    for p in compared:
        mine = [r for r in compared if r.frontier == p.frontier and r.parent == p.setting]
        if mine:
            relaxed = next((r for r in mine if r.intervention and r.intervention.role == Role.RELAXED), None)
            control = next((r for r in mine if r.intervention and r.intervention.role == Role.CONTROL), None)
            verdict, why = confirmation(p.knee_label, relaxed, control)
            why += _predicted_moves(relaxed, control)
            after = None if relaxed is None else relaxed.knee_label or ("nothing broke" if relaxed.lo_rps else None)
            p = msgspec.structs.replace(p, verdict=verdict, verdict_why=why, next_label=after)
        out.append(p)
    return out


class NoQueueLabel(StrEnum):
    """A knee's own label where the diagnosis found no queue and nothing full."""

    ITL_BOUND = "ITL-bound"


class NoQueue:
    """What a knee's own label means (`_knee_label` names it): no limit full, so none an
    intervention relaxes, and only the work per step or the compute behind it moves the knee."""

    knob: Knob | None = None
    moves_the_knee: str | None = "more compute or a smaller batch"


def meaning(label: str | None) -> Meaning:
    """What a knee's label means: its knob and what would move the knee, from its rule."""
    if label in {n.value for n in NoQueueLabel}:
        return NoQueue()
    return labelled(label)


@dataclass(frozen=True)
class ProbeRun:
    """A probe's run as the frontier tables read it."""

    run_id: str
    status: str
    workload: str | None
    probe: FrontierProbe  # its run.json block


def probe_runs(con: duckdb.DuckDBPyConnection, metas: Mapping[str, RunMeta] | None = None
               ) -> dict[tuple[str, str], list[ProbeRun]]:
    """(frontier, setting) -> its probe runs, latest run per probe, in probe order
    (`metas`: signals.run_metas, where the caller has read them)."""
    latest: dict[tuple[str, str, int], ProbeRun] = {}
    for run_id, meta in (signals.run_metas(con) if metas is None else metas).items():  # ordered by started_at
        f = meta.frontier
        if f:
            latest[(f.name, f.setting, f.probe)] = ProbeRun(run_id, meta.status, meta.workload, f)
    out: dict[tuple[str, str], list[ProbeRun]] = {}
    for (name, setting, _), run in sorted(latest.items()):
        out.setdefault((name, setting), []).append(run)
    return out


def _knee_label(d: DiagnosisRow | None, probe: FrontierProbe) -> tuple[str | None, str | None]:
    if d is None:
        return None, None
    label, clue = d.label, d.clue
    if label not in (Label.REFERENCE, Label.UNCLASSIFIED):
        return label, clue
    why = (f"its run queued too little to be labelled (waiting {_pct(d.waiting_share)} of the time, vLLM's queue "
           f"{_pct(d.window_queue_share)} of TTFT)")
    if broke_on_backlog(probe):
        why = f"its requests met the SLO but its queue grew {probe.backlog_growth:.3g} s/s"
    if d.held_by:
        # the probe broke: what held the waiting the scrapes saw is what filled first
        return d.held_by, f"{why}; the waiting the scrapes saw was held by {d.bound}"
    missed = probe.missed or {}
    itl, ttft, failed = missed.get("itl", 0), missed.get("ttft", 0), missed.get("failed", 0)
    own = NoQueueLabel.ITL_BOUND if itl > ttft else Label.COMPUTE
    return own, (f"SLO broken with no queue a scrape saw (waiting {_pct(d.waiting_share)} of the time): of "
                 f"{probe.requests} requests {itl} over the ITL SLO, {ttft} over the TTFT SLO, {failed} failed")


def _pct(share: float | None) -> str:
    return "unknown" if share is None else f"{share:.0%}"


def broke_on_backlog(probe: FrontierProbe) -> bool:
    """The probe broke while its attainment alone would have held it: its backlog grew."""
    return (probe.held is False and probe.backlog_growth is not None and probe.backlog_growth > 0
            and probe.attainment_lo is not None and probe.target is not None and probe.attainment_lo >= probe.target)


def _interval(search: SearchRecord | None) -> dict[str, float | bool | None]:
    """The knee's interval, estimate and drift columns of a search (None without search.json)."""
    result = search.result if search else None
    drift = search.drift if search else None
    return {"floor_rps": result.floor if result else None, "confidence": result.confidence if result else None,
            "hi_inconclusive": result.hi_inconclusive if result else None,
            "estimate_rps": search.estimate_rps if search else None,
            "drift_start_rps": drift.start_rps if drift else None, "drift_end_rps": drift.end_rps if drift else None,
            "drift": drift.change if drift else None, "drifted": drift.drifted if drift else None}


def _relaxation(search: SearchRecord | None) -> Intervention | None:
    """What an intervention relaxes (None for a setting of the config)."""
    i = search.intervention if search else None
    if i is None:
        return None
    check = search.paired
    found = None if check is None else paired.verdict(paired.blocks_of(check), i.min_shift)
    columns = {} if check is None or found is None else _paired_columns(found, i.knob.value, check.concurrency)
    return Intervention(parent=i.parent, knob=i.knob.value, relaxed_from=i.before, relaxed_to=i.after,
                        min_shift=i.min_shift, **columns)


def _paired_columns(found: paired.PairedVerdict, knob: str, concurrency: int) -> dict[str, Any]:
    """An intervention's paired_* columns."""
    return {"paired_concurrency": concurrency, "paired_verdict": found.verdict, "paired_shift": found.shift,
            "paired_shift_lo": found.shift_lo, "paired_shift_hi": found.shift_hi, "paired_why": paired_why(found, knob)}


def paired_why(found: paired.PairedVerdict, knob: str) -> str:
    """What an intervention's paired check found, in words."""
    if found.shift is None:
        return "a block of the paired check failed"
    said = (f"side by side, relaxing {knob} moved the completions per second {numbers.change(found.shift)} "
            f"(pairs {numbers.change(found.shift_lo)} to {numbers.change(found.shift_hi)})")
    said += {True: "; the relaxed setting used it beyond the old limit",
             False: "; the relaxed setting never used it beyond the old limit",
             None: "; the scrapes do not show whether it was used beyond the old limit"}[found.used]
    if found.fell is not None:
        said += "; its queue share fell" if found.fell else "; its queue share did not fall"
    if found.verdict is not Confirmation.CONFIRMED:
        said += f" (a move needs {numbers.share(found.least_shift)} in every pair and the resource used)"
    return said


_UNDIAGNOSED = DiagnosisRow(run_id="", experiment="")  # a probe with no diagnosis row: no signal crossed


def _row(name: str, setting: str, probes: list[ProbeRun], search: SearchRecord | None,
         diag: dict[str, DiagnosisRow], rates: dict[str, dict[str, Any]], rules: DiagnosisRules) -> FrontierRow:
    """One search's row, before its interventions are compared."""
    measured = [p for p in probes if p.probe.attainment is not None]
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
    # an unsearched intervention has no probes: what it would have been searched under is its search.json's
    if probes:
        workload, slo, target = probes[0].workload, probes[0].probe.slo, probes[0].probe.target
    else:
        assert search is not None
        workload, slo, target = search.workload, search.slo, search.bounds.target
    sides: dict[str, Any] = {}
    for side, p in (("lo", lo_p), ("hi", hi_p)):
        r = rates.get(p.run_id, {}) if p else {}
        offered = r.get("offered_rps")
        sides[f"{side}_offered_rps"] = offered
        sides[f"{side}_output_tok_s"] = r.get("total_tok_s")
        sides[f"{side}_attainment"] = p.probe.attainment if p else None
        sides[f"{side}_goodput_rps"] = p.probe.attainment * offered if p and offered is not None else None
    knee_label, knee_clue = _knee_label(diag.get(hi_p.run_id), hi_p.probe) if hi_p else (None, None)

    def lowest(crossed: Callable[[DiagnosisRow, dict[str, Any]], bool]) -> float | None:
        return min((p.probe.rate for p in measured
                    if crossed(diag.get(p.run_id, _UNDIAGNOSED), rates.get(p.run_id, {}))), default=None)

    return FrontierRow(
        frontier=name, setting=setting, workload=workload, slo_ttft_ms=slo.ttft_ms, slo_itl_ms=slo.itl_ms,
        target=target, probes=len(probes), reason=result.reason.value if result else None,
        error=result.error if result else None, lo_rps=lo, hi_rps=hi, **_interval(search), **sides,
        lo_run_id=lo_p.run_id if lo_p else None, knee_run_id=hi_p.run_id if hi_p else None,
        knee_label=knee_label, knee_clue=knee_clue,
        waiting_from_rps=lowest(lambda d, r: (d.waiting_share or 0) > 0),
        cap_from_rps=lowest(lambda d, r: (d.running_at_cap_share or 0) > 0),
        kv_full_from_rps=lowest(lambda d, r: (d.kv_full_share or 0) > 0),
        ttft_p95_from_rps=lowest(lambda d, r: r.get("ttft_p95_ms") is not None and r["ttft_p95_ms"] > slo.ttft_ms),
        intervention=_relaxation(search))


def frontier_rows(con: duckdb.DuckDBPyConnection) -> list[FrontierRow]:
    """The rows of table `frontiers`, computed from the ingested probes and searches."""
    if not table_exists(con, "diagnosis"):
        raise UserError("no diagnosis table (run `filledfirst diagnose` first)")
    rules = stored_rules(con)
    metas = signals.run_metas(con)
    groups = probe_runs(con, metas)
    diag = {d["run_id"]: DiagnosisRow.from_columns(d)
            for d in pl.from_arrow(con.sql("SELECT * FROM diagnosis").to_arrow_table()).to_dicts()}
    rates = {r["run_id"]: r for r in signals.run_rates(con).to_dicts()}
    searches: dict[tuple[str, str], SearchRecord] = {}  # each ingested search's search.json
    if table_exists(con, "frontier_searches"):
        searches = {(f, s): SearchRecord.loads(doc, f"table frontier_searches, row {f}/{s}")
                    for f, s, doc in con.execute("SELECT frontier, setting, search FROM frontier_searches").fetchall()}
    # an unsearched intervention's row comes from its search.json; probes of an earlier search of it do not count
    alone = {key: [] for key, s in searches.items() if s.result.reason is StopReason.NOT_SEARCHED}
    groups = {key: probes for key, probes in groups.items() if key not in alone}
    if not groups:
        return []
    rows = [_row(name, setting, probes, searches.get((name, setting)), diag, rates, rules)
            for (name, setting), probes in {**groups, **alone}.items()]
    found = prediction.searches(con, metas, {key: [p.run_id for p in probes] for key, probes in groups.items()})
    return _interventions(_predicted(rows, found))


MIN_SHIFT = schema_default("frontiers", "*", "interventions", "min_shift")
DOUBLED = float(schema_default("frontiers", "*", "interventions", "factor"))  # the original study's relaxation


def _predicted(rows: list[FrontierRow], found: dict[tuple[str, str], prediction.Search]) -> list[FrontierRow]:
    """Each row with its prediction, and an intervention's with the shift its parent's
    prediction gives it."""
    least = {(r.frontier, r.parent): r.intervention.min_shift for r in rows if r.intervention}
    out = []
    for r in rows:
        s = found.get((r.frontier, r.setting))
        slo, target = Slo(r.slo_ttft_ms, r.slo_itl_ms), r.target or 1.0
        if s is not None:
            share = (r.intervention.min_shift if r.intervention else least.get((r.frontier, r.setting))) or MIN_SHIFT
            r = msgspec.structs.replace(r, prediction=prediction.predict(s.model, s.limits, s.shape, slo, target,
                                                                         r.knee_rps, share))
        parent = found.get((r.frontier, r.parent)) if r.parent else None
        i = r.intervention
        if parent is not None and i is not None and i.relaxed_from and i.relaxed_to and i.knob in prediction.RELAXES:
            factor = i.relaxed_to / i.relaxed_from
            moved = prediction.shift(parent, Knob(i.knob), factor, slo, target)
            doubled = prediction.shift(parent, Knob(i.knob), DOUBLED, slo, target) if factor > DOUBLED else None
            side_by_side = (None if i.paired_concurrency is None
                            else prediction.paired_shift(parent, Knob(i.knob), factor, i.paired_concurrency))
            r = msgspec.structs.replace(r, intervention=msgspec.structs.replace(
                i, predicted_shift=moved, predicted_shift_doubled=doubled, predicted_paired_shift=side_by_side))
        out.append(r)
    return out


def frontier_table(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    return pl.DataFrame([r.columns() for r in frontier_rows(con)], schema=SCHEMA)


def write_frontiers(db_path: str | Path) -> pl.DataFrame:
    """Store `frontier_table` as table `frontiers` (empty for a study without searches)."""
    from filledfirst.store.ingest import edited_copy

    with edited_copy(db_path) as con:
        df = frontier_table(con)
        con.register("_frontiers_new", df.to_arrow())
        con.execute("CREATE OR REPLACE TABLE frontiers AS SELECT * FROM _frontiers_new")
        con.unregister("_frontiers_new")
    return df
