"""Table `frontiers`, typed: a row per (frontier, setting), built once where the table is
computed (filledfirst.analysis.frontiers, which documents each column) or read back
(`FrontierRow.from_columns`), and read by the report and the comparison as fields.

An intervention's row carries what it relaxes and how its knee compares with its
parent's (`Intervention`); a row with a step model its prediction (`Prediction`); a
parent with interventions carries the verdict on its knee's label (`verdict`,
`verdict_why`, `next_label`). The table itself stays flat: `columns` and `from_columns`
are the one mapping between the two.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import msgspec


class Confirmation(StrEnum):
    """Did relaxing what filled first move the knee, and the control not?"""

    CONFIRMED = "confirmed"
    NOT_CONFIRMED = "not confirmed"
    INCONCLUSIVE = "inconclusive"


class Role(StrEnum):
    RELAXED = "relaxed"  # relaxes the limit named at its parent's knee
    CONTROL = "control"  # relaxes the other one by the same factor


class Intervention(msgspec.Struct, frozen=True, kw_only=True):
    """What an intervention relaxes (its search.json) and, once its parent's row is known,
    its role and how far its knee moved from the parent's (None: not compared)."""

    parent: str  # the setting it relaxes
    knob: str
    relaxed_from: int | None = None
    relaxed_to: int | None = None
    min_shift: float | None = None
    role: Role | None = None
    least_shift: float | None = None
    shift: float | None = None
    moved: str | None = None
    within_drift: bool | None = None
    interval_move: str | None = None
    # the parent's knee moved by relaxing this knob as the parent's model predicts it
    predicted_shift: float | None = None
    # the same for the knob doubled (the original study's relaxation), where it is relaxed further
    predicted_shift_doubled: float | None = None
    # its paired check (filledfirst.frontier.paired): verdict, shift (the pairs' geometric
    # mean, their lowest and highest) and why; None: not paired
    paired_verdict: Confirmation | None = None
    paired_shift: float | None = None
    paired_shift_lo: float | None = None
    paired_shift_hi: float | None = None
    paired_why: str | None = None
    paired_concurrency: int | None = None  # the paired check's closed loop
    # the paired check's shift as the parent's model predicts it (filledfirst.analysis.prediction.paired_shift)
    predicted_paired_shift: float | None = None


class Prediction(msgspec.Struct, frozen=True, kw_only=True):
    """A search's knee as the engine's fitted step time predicts it
    (filledfirst.analysis.prediction), beside the measured one."""

    predicted_rps: float  # the first limit's knee
    predicted_first: str  # which limit fills first (filledfirst.analysis.prediction.Limit)
    predicted_next: str | None = None
    predicted_next_rps: float | None = None
    predicted_cap_rps: float | None = None
    predicted_kv_rps: float | None = None
    predicted_budget_rps: float | None = None
    predicted_compute_rps: float | None = None
    predicted_itl_rps: float | None = None
    model_scope: str | None = None  # the step model used: the setting's own or the engine's
    predicted_ratio: float | None = None  # measured knee (geometric mean of lo and hi) / predicted
    would_take: str | None = None  # the cheapest single change predicted to move it by min_shift


class FrontierRow(msgspec.Struct, frozen=True, kw_only=True):
    """A row of table `frontiers`."""

    frontier: str
    setting: str
    slo_ttft_ms: float
    slo_itl_ms: float
    probes: int
    workload: str | None = None
    target: float | None = None
    reason: str | None = None
    error: str | None = None
    floor_rps: float | None = None
    confidence: float | None = None
    hi_inconclusive: bool | None = None
    estimate_rps: float | None = None
    drift_start_rps: float | None = None
    drift_end_rps: float | None = None
    drift: float | None = None
    drifted: bool | None = None
    lo_rps: float | None = None
    hi_rps: float | None = None
    lo_offered_rps: float | None = None
    hi_offered_rps: float | None = None
    lo_output_tok_s: float | None = None
    hi_output_tok_s: float | None = None
    lo_attainment: float | None = None
    hi_attainment: float | None = None
    lo_goodput_rps: float | None = None
    hi_goodput_rps: float | None = None
    lo_run_id: str | None = None
    knee_run_id: str | None = None
    knee_label: str | None = None
    knee_clue: str | None = None
    waiting_from_rps: float | None = None
    cap_from_rps: float | None = None
    kv_full_from_rps: float | None = None
    ttft_p95_from_rps: float | None = None
    intervention: Intervention | None = None  # None: a setting of the config
    prediction: Prediction | None = None  # None: no step model or no answered request
    verdict: Confirmation | None = None
    verdict_why: str | None = None
    next_label: str | None = None

    @property
    def knee_rps(self) -> float | None:
        """The measured knee as one rate: the geometric mean of lo and hi (None without both)."""
        return (self.lo_rps * self.hi_rps) ** 0.5 if self.lo_rps and self.hi_rps else None

    @property
    def parent(self) -> str | None:
        return self.intervention.parent if self.intervention else None

    def columns(self) -> dict[str, Any]:
        """The table's columns: the intervention's fields flat, NULL for a setting of the config."""
        out = msgspec.structs.asdict(self)
        for name, kind in (("intervention", Intervention), ("prediction", Prediction)):
            part = out.pop(name)
            out.update({f: None for f in kind.__struct_fields__} if part is None else msgspec.structs.asdict(part))
        return out

    @classmethod
    def from_columns(cls, row: dict[str, Any]) -> FrontierRow:
        """A row of the stored table (the intervention's columns NULL for a setting of the config)."""
        own = {k: v for k, v in row.items() if k in cls.__struct_fields__}
        if row.get("parent") is not None:
            own["intervention"] = {k: row.get(k) for k in Intervention.__struct_fields__}
        if row.get("predicted_rps") is not None:
            own["prediction"] = {k: row.get(k) for k in Prediction.__struct_fields__}
        return msgspec.convert(own, cls)
