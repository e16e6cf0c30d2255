"""Interventions: a search's setting with one limit relaxed, to test what filled first.

For each setting a frontier's `interventions` name, two more searches of the same shape:
the sequence cap (max_num_seqs) and the KV budget (in tokens), each times its `factor`.
Which one relaxes the limit that filled first at the knee and which is the control is
known only once the knee's probe is diagnosed, so table `frontiers` assigns the roles
(filledfirst.analysis.frontiers). The workflow can then name every search before any of
them has run. Each intervention starts from its parent's knee (filledfirst.run.search).

Whether a knee moved (`move`) is decided by both knees' intervals and a least shift of the
highest rate held: the frontier's interventions.min_shift, widened by the drift the parent's search
measured (`widened`: the interventions run after it, on a machine whose speed changed that
much over one search); an intervention's search stops as soon as further probes could not
change that answer and it has seen a rate break (`decided`), since its purpose is the
verdict and what fills next, not a knee as precise as its parent's.

The KV budget is relaxed in the unit the setting states it in: `kv_tokens`, or
`num_gpu_blocks_override` (blocks of block_size tokens: the same tokens). A setting with
neither has no KV budget to relax (a share of GPU memory is not one), and `relaxations`
says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from filledfirst.contracts.search import Intervention, Knob, ResultRecord, StopReason
from filledfirst.frontier.verdict import interval_floor
from filledfirst.model.kv import block_size

_KNOB = {Knob.SEQS: "seqs", Knob.KV: "kv"}


def intervention_name(parent: str, knob: Knob, factor: int) -> str:
    """The setting name of `parent` with `knob` relaxed `factor` times (its folder:
    results/frontiers/<frontier>/<name>): seq8_seqs_x2, kv160_kv_x4."""
    return f"{parent}_{_KNOB[knob]}_x{factor}"


def relaxations(parent: str, server: Mapping[str, Any], launcher: str, min_shift: float,
                factor: int, paired: bool = False, search: bool = True) -> tuple[list[Intervention], list[str]]:
    """The interventions of `parent`, whose vLLM settings (the engine's under the setting's)
    are `server`, and why any cannot be made; `min_shift`, `factor`, `paired` and `search`:
    the frontier's interventions.min_shift, .factor, .paired and .search."""
    out, problems = [], []
    cap = server.get("max_num_seqs")
    if cap is None:
        problems.append(f"setting {parent!r}: state max_num_seqs (in engine.server or the setting) to relax it")
    else:
        out.append(Intervention(parent=parent, knob=Knob.SEQS, before=int(cap), after=int(cap) * factor,
                                changes={"max_num_seqs": int(cap) * factor}, min_shift=min_shift,
                                paired=paired, search=search))
    if server.get("kv_tokens") is not None:
        tokens = int(server["kv_tokens"])
        changes: dict[str, Any] = {"kv_tokens": tokens * factor}
    elif server.get("num_gpu_blocks_override") is not None:
        blocks = int(server["num_gpu_blocks_override"])
        tokens, changes = blocks * block_size(launcher, server), {"num_gpu_blocks_override": blocks * factor}
    else:
        tokens = None
        problems.append(f"setting {parent!r}: state its KV budget (kv_tokens) to relax it; a share of memory "
                        "(gpu_memory_utilization) means other tokens on other GPUs")
    if tokens is not None:
        out.append(Intervention(parent=parent, knob=Knob.KV, before=tokens, after=tokens * factor, changes=changes,
                                min_shift=min_shift, paired=paired, search=search))
    return out, problems


class Move(StrEnum):
    UP = "up"
    DOWN = "down"
    NO = "no"


@dataclass(frozen=True, slots=True)
class Span:
    """A knee as an interval [floor, hi) (floor 0 when nothing held, hi infinite when
    nothing broke) and `lo`, the highest rate held (None: none held)."""

    floor: float
    hi: float
    lo: float | None

    @classmethod
    def of(cls, lo: float | None, hi: float | None, floor: float | None) -> Span:
        low = floor if floor is not None else (lo if lo is not None else 0.0)
        return cls(floor=low, hi=math.inf if hi is None else hi, lo=lo)

    @classmethod
    def measured(cls, lo: float | None, hi: float | None, floor: float | None, reason: str | None) -> Span | None:
        """A search's knee, None when it measured none (it failed, or held and broke nothing)."""
        if reason == StopReason.PROBE_FAILED or (lo is None and hi is None):
            return None
        return cls.of(lo, hi, floor)

    @classmethod
    def of_result(cls, result: ResultRecord) -> Span | None:
        """A search.json's knee (`measured`)."""
        return cls.measured(result.lo, result.hi, result.floor, result.reason)


def lo_ratio(before_lo: float | None, after_lo: float | None) -> float | None:
    """The highest rate held after over before (None when either held nothing)."""
    return after_lo / before_lo if before_lo and after_lo is not None else None


def widened(minimum: float, *drifts: float | None) -> float:
    """The least change that counts, `minimum` widened by each drift (None: none measured):
    a server whose speed changed by d over a search can move a knee measured after it by
    that much with nothing else changed."""
    factor = 1 + minimum
    for d in drifts:
        factor *= 1 + abs(d or 0.0)
    return factor - 1


def move(before: Span, after: Span, min_shift: float = 0.0) -> Move:
    """UP when after's interval lies wholly above before's and its highest rate held is at
    least (1 + min_shift) times before's, DOWN the same below, NO otherwise (the ratio is
    not asked for when either held nothing)."""
    ratio = lo_ratio(before.lo, after.lo)
    if after.floor >= before.hi and (ratio is None or ratio >= 1 + min_shift):
        return Move.UP
    if after.hi <= before.floor and (ratio is None or ratio <= 1 / (1 + min_shift)):
        return Move.DOWN
    return Move.NO


def decided(before: Span, lo: float, hi: float, tolerance: float | None, min_shift: float) -> Move | None:
    """The `move` from `before` that a search whose bracket is [lo held, hi broke) must end
    with, whatever it probes next (None: not decided yet). Bisecting only raises lo and
    lowers hi within the bracket, so the final highest rate held is in [lo, hi) and the
    final lowest break in (lo, hi]; `tolerance`: the backlog growth the interval's floor
    allows for (interval_floor)."""
    up = before.lo * (1 + min_shift) if before.lo else 0.0
    down = before.lo / (1 + min_shift) if before.lo else math.inf
    if interval_floor(lo, tolerance) >= before.hi and lo >= up:
        return Move.UP
    if hi <= before.floor and hi <= down:
        return Move.DOWN
    up_impossible = interval_floor(hi, tolerance) <= before.hi or hi <= up
    down_impossible = lo >= before.floor or lo > down
    return Move.NO if up_impossible and down_impossible else None
