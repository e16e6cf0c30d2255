"""The capacity searches matched by (frontier, setting): both knees with their intervals
(table `frontiers`, filledfirst.analysis.frontiers), the shift of the highest rate held and
a verdict: higher or lower when the candidate's interval lies wholly beyond the baseline's
and the shift is beyond the least that counts (the same test as an intervention's
`moved`), else no significant change; and what filled first at each side's knee.

The least shift that counts is `knee_min_shift`, widened by each side's drift (the
server's speed on the search's closed loop after it against before it): a knee measured
while the server's speed moved by 50 % cannot tell a 50 % change of the setup from it.
The same small study run twice gave 12.5 and 19.1 req/s, its second search's server
speeding up by 50 % over the search."""

from __future__ import annotations

from typing import Any

from filledfirst.analysis.frontiers import knee_span, moved, unsearched
from filledfirst.compare.verdicts import Change
from filledfirst.contracts.frontiers import FrontierRow
from filledfirst.frontier.interventions import lo_ratio, widened
from filledfirst.study import Compare

_MOVED = {"up": Change.HIGHER, "down": Change.LOWER, "no": Change.SAME, None: Change.NOT_COMPARABLE}


def least_shift(base: FrontierRow, cand: FrontierRow, rules: Compare) -> float:
    """knee_min_shift widened by both sides' drift."""
    return widened(rules.knee_min_shift, base.drift, cand.drift)


def knee_row(key: tuple[str, str], base: FrontierRow, cand: FrontierRow, rules: Compare) -> dict[str, Any]:
    b_lo, c_lo = base.lo_rps, cand.lo_rps
    shift = least_shift(base, cand, rules)
    span_b, span_c = knee_span(base), knee_span(cand)
    return {
        "frontier": key[0], "setting": key[1],
        "base_lo_rps": b_lo, "base_floor_rps": span_b[0] if span_b else None, "base_hi_rps": base.hi_rps,
        "cand_lo_rps": c_lo, "cand_floor_rps": span_c[0] if span_c else None, "cand_hi_rps": cand.hi_rps,
        "shift": None if (ratio := lo_ratio(b_lo, c_lo)) is None else ratio - 1,
        "min_shift": shift,
        "verdict": str(_MOVED[moved(base, cand, shift)]),
        "base_label": base.knee_label, "cand_label": cand.knee_label,
        "label_changed": label_changed(base.knee_label, cand.knee_label),
        "base_drift": base.drift, "cand_drift": cand.drift,
    }


def label_changed(a: str | None, b: str | None) -> bool | None:
    """Whether what filled first differs (None: a side has no label)."""
    return None if a is None or b is None else a != b


def knee_rows(base: list[FrontierRow], cand: list[FrontierRow], rules: Compare
              ) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """The matched knees, and the (frontier/setting) names on the baseline or candidate only
    (an intervention judged side by side alone has no knee)."""
    b = {(r.frontier, r.setting): r for r in base if not unsearched(r)}
    c = {(r.frontier, r.setting): r for r in cand if not unsearched(r)}
    rows = [knee_row(k, b[k], c[k], rules) for k in b if k in c]
    return rows, [f"{f}/{s}" for f, s in b if (f, s) not in c], [f"{f}/{s}" for f, s in c if (f, s) not in b]
