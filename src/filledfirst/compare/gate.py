"""What fails a scheduled job: a knee significantly lower by at least `knee_drop`, or
what filled first changing at a matched knee or in a matched run designed for a pattern
(`expect`; the config's `compare.fail_on`). One line per reason; none means the job
passes. A run designed for nothing (a replay, a sweep point) may change its label
between two nights at the same setup: two demo runs twenty minutes apart on one machine
labelled two closed loops `unclassified` then `reference`; the page marks such a change,
the gate does not fail on it."""

from __future__ import annotations

from filledfirst.compare import Comparison
from filledfirst.compare.verdicts import Change
from filledfirst.study import CompareGate


def reasons(comparison: Comparison, fail_on: CompareGate) -> list[str]:
    out = []
    for k in comparison.knees:
        name = f"{k['frontier']}/{k['setting']}"
        if (fail_on.knee_drop is not None and k["verdict"] == Change.LOWER
                and k["shift"] is not None and -k["shift"] >= fail_on.knee_drop):
            out.append(f"knee {name}: {k['base_lo_rps']:.4g} -> {k['cand_lo_rps']:.4g} req/s ({k['shift']:+.0%}), "
                       f"beyond both intervals and the {fail_on.knee_drop:.0%} allowed")
        if fail_on.label_change and k["label_changed"]:
            out.append(f"knee {name}: what filled first changed, {k['base_label']} -> {k['cand_label']}")
    if fail_on.label_change:
        for r in comparison.labels:
            if r["label_changed"] and r["expect"]:
                out.append(f"run {r['experiment']}: what filled first changed, {r['base_label']} -> {r['cand_label']}")
    return out
