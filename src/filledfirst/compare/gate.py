"""What fails a scheduled job: a knee whose interval lies wholly below the baseline's and
whose highest rate held dropped by `knee_drop` (widened by both searches' drift), or
what filled first changing at a matched knee or in a matched run designed for a pattern
(`expect`; the config's `compare.fail_on`). One line per reason; none means the job
passes. A run designed for nothing (a replay, a sweep point) may change its label
between two nights at the same setup: two demo runs twenty minutes apart on one machine
labelled two closed loops `unclassified` then `reference`; the page marks such a change,
the gate does not fail on it."""

from __future__ import annotations

from typing import Any

from filledfirst.compare import Comparison
from filledfirst.compare.verdicts import Change
from filledfirst.frontier.interventions import Span, lo_ratio, widened
from filledfirst.study import CompareGate


def dropped(knee: dict[str, Any], knee_drop: float) -> bool:
    """The candidate's knee interval wholly below the baseline's, and its highest rate
    held lower by at least the share knee_drop, after allowing for each search's drift
    (a server whose speed moved by d over its search can move its knee that much). The
    page's verdict `lower` asks for compare.knee_min_shift instead: a change of the setup
    beyond doubt; the gate fails on less, a drop worth a look."""
    if knee["verdict"] == Change.NOT_COMPARABLE:
        return False
    base = Span.of(knee["base_lo_rps"], knee["base_hi_rps"], knee["base_floor_rps"])
    cand = Span.of(knee["cand_lo_rps"], knee["cand_hi_rps"], knee["cand_floor_rps"])
    ratio = lo_ratio(base.lo, cand.lo)
    allowed = (1 - knee_drop) / (1 + widened(0.0, knee["base_drift"], knee["cand_drift"]))
    return cand.hi <= base.floor and ratio is not None and ratio <= allowed


def reasons(comparison: Comparison, fail_on: CompareGate) -> list[str]:
    out = []
    for k in comparison.knees:
        name = f"{k['frontier']}/{k['setting']}"
        if fail_on.knee_drop is not None and dropped(k, fail_on.knee_drop):
            out.append(f"knee {name}: {k['base_lo_rps']:.4g} -> {k['cand_lo_rps']:.4g} req/s ({k['shift']:+.0%}), "
                       f"below the baseline's interval and the {fail_on.knee_drop:.0%} allowed (widened by the "
                       "searches' drift)")
        if fail_on.label_change and k["label_changed"]:
            out.append(f"knee {name}: what filled first changed, {k['base_label']} -> {k['cand_label']}")
    if fail_on.label_change:
        for r in comparison.labels:
            if r["label_changed"] and r["expect"]:
                out.append(f"run {r['experiment']}: what filled first changed, {r['base_label']} -> {r['cand_label']}")
    return out
