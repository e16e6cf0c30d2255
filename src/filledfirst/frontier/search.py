"""Capacity search over offered rate: which rate to probe next, and when to stop.

A pure, deterministic state machine. The runner asks `next_rate()`, runs an open-loop
probe at that rate, and hands back the outcome with `record()`, until `done`; then
`result()` is the bracket. Nothing here reads a clock, a file or a random number.

A probe *holds* when its attainment (share of its requests that met the SLO, failed
requests counting as missed: see `attainment`) is >= `target`; it *breaks* otherwise.
A rate holds only when every probe at that rate held: the conservative verdict, so a
noisy probe can lower the estimate but a single lucky one cannot raise it past a
re-probe.

Phases (all rates in requests per second):

1. grow: start, start*growth, start*growth^2, ... (the last one clamped to `maximum`)
   until a probe breaks or `maximum` holds;
2. bisect geometrically: sqrt(lo*hi) until hi/lo <= precision;
3. repeats: re-probe lo until it has 1 + `repeats` probes. Should one break, lo becomes
   the new hi, the next lower held rate the new lo, and bisection resumes. hi is never
   re-probed: under the conservative verdict one break is final, so its repeats could
   not change anything.

The state is a function of the probes done alone (lo = highest rate that held, hi =
lowest that broke, every held rate below every broken one), so `CapacitySearch(bounds,
done)` resumes an interrupted search exactly: it proposes what the uninterrupted search
would have proposed next. The replayed probes must be the ones this search would have
asked for (same bounds); otherwise construction fails rather than guess.

Probe count (`probe_bound`), noiseless, with G = ceil(log(maximum/start)/log(growth)):
  breaks at start:      1
  holds at maximum:     G + 1 + repeats
  converged:            <= G + 1 + B + repeats, B = max(0, ceil(log2(ln(growth)/ln(precision))))
(the grow phase probes at most G + 1 rates; after it hi/lo <= growth, and each bisection
halves log(hi/lo)). With noise, each broken repeat at lo can cost up to B more
bisections and `repeats` more repeats; `budget` caps the total in every case.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from filledfirst.contracts.search import ResultRecord, SearchBounds, StopReason

# Relative tolerance for "the same rate": a rate read back from a probe's run.json, or
# a grown rate a rounding error below `maximum`.
_REL_TOL = 1e-9


@dataclass(frozen=True, slots=True)
class ProbeOutcome:
    """One probe: its rate and attainment, or `error` when it failed outright (then
    attainment is None and the search ends)."""

    rate: float
    attainment: float | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate", float(self.rate))
        if (self.attainment is None) == (self.error is None):
            raise ValueError("a probe outcome has an attainment or an error, exactly one")
        if self.attainment is not None and not (0 <= self.attainment <= 1):
            raise ValueError(f"attainment must be in [0, 1], got {self.attainment}")

    @classmethod
    def failed(cls, rate: float, reason: str) -> ProbeOutcome:
        return cls(rate, None, reason or "failed")

    @property
    def ok(self) -> bool:
        return self.error is None

    def holds(self, target: float) -> bool:
        return self.attainment is not None and self.attainment >= target


@dataclass(frozen=True, slots=True)
class SearchResult:
    """`lo`: highest rate that held (None: none did); `hi`: lowest that broke (None: none
    did). The capacity lies in [lo, hi) for a monotone server."""

    lo: float | None
    hi: float | None
    reason: StopReason
    probes: tuple[ProbeOutcome, ...]
    error: str | None = None  # the failed probe's reason, for PROBE_FAILED

    @property
    def ratio(self) -> float | None:
        return self.hi / self.lo if self.lo is not None and self.hi is not None else None

    def record(self) -> ResultRecord:
        """As search.json keeps it."""
        return ResultRecord(lo=self.lo, hi=self.hi, ratio=self.ratio, reason=self.reason, error=self.error)


@dataclass(frozen=True, slots=True)
class _State:
    lo: float | None
    hi: float | None
    lo_probes: int  # probes at lo (all held)
    failed: ProbeOutcome | None


def _state(probes: Iterable[ProbeOutcome], target: float) -> _State:
    held: dict[float, int] = {}
    broke: set[float] = set()
    for p in probes:
        if not p.ok:
            return _State(None, None, 0, p)
        if p.holds(target):
            held[p.rate] = held.get(p.rate, 0) + 1
        else:
            broke.add(p.rate)
    hi = min(broke, default=None)
    good = [r for r in held if r not in broke]
    lo = max(good, default=None)
    return _State(lo, hi, held[lo] if lo is not None else 0, None)


class CapacitySearch:
    """`CapacitySearch(bounds)` starts a search; `CapacitySearch(bounds, done)` resumes
    one from the probes already done, in the order they ran."""

    def __init__(self, bounds: SearchBounds, done: Iterable[ProbeOutcome] = ()) -> None:
        self.bounds = bounds
        self._probes: list[ProbeOutcome] = []
        for i, probe in enumerate(done):
            expected = self.next_rate()
            if expected is None:
                raise ValueError(f"probe {i} at {probe.rate:g}/s: the search had already stopped "
                                 f"({self.result().reason}); were the bounds changed?")
            if not math.isclose(probe.rate, expected, rel_tol=_REL_TOL):
                raise ValueError(f"probe {i} ran at {probe.rate:g}/s where this search would probe "
                                 f"{expected:g}/s; were the bounds changed?")
            self.record(probe)

    @property
    def probes(self) -> tuple[ProbeOutcome, ...]:
        return tuple(self._probes)

    def _decide(self) -> tuple[float | None, StopReason | None]:
        """(next rate, None) while running; (None, why) once stopped."""
        b = self.bounds
        s = _state(self._probes, b.target)
        if s.failed is not None:
            return None, StopReason.PROBE_FAILED
        if not self._probes:
            rate = b.start
        elif s.hi is None:  # grow; every probe so far held
            if s.lo >= b.maximum:
                rate = None if s.lo_probes > b.repeats else s.lo
            else:
                grown = s.lo * b.growth
                rate = b.maximum if grown * (1 + _REL_TOL) >= b.maximum else grown
            if rate is None:
                return None, StopReason.HOLDS_AT_MAXIMUM
        elif s.lo is None:
            return None, StopReason.BREAKS_AT_START
        elif s.hi / s.lo > b.precision * (1 + _REL_TOL):
            rate = math.sqrt(s.lo * s.hi)
        elif s.lo_probes <= b.repeats:
            rate = s.lo
        else:
            return None, StopReason.CONVERGED
        if len(self._probes) >= b.budget:
            return None, StopReason.BUDGET
        return rate, None

    def next_rate(self) -> float | None:
        """The rate to probe next, or None when the search is done."""
        return self._decide()[0]

    @property
    def finished(self) -> bool:
        return self._decide()[0] is None

    def record(self, outcome: ProbeOutcome) -> None:
        """The outcome of the probe `next_rate()` proposed."""
        expected = self.next_rate()
        if expected is None:
            raise ValueError("the search is done: no probe to record")
        if not math.isclose(outcome.rate, expected, rel_tol=_REL_TOL):
            raise ValueError(f"probed {outcome.rate:g}/s, but the search asked for {expected:g}/s")
        # Keep the proposed rate itself, so a resumed search computes with the same floats.
        self._probes.append(ProbeOutcome(expected, outcome.attainment, outcome.error))

    def result(self) -> SearchResult | None:
        """The bracket and why the search stopped; None while it runs."""
        rate, reason = self._decide()
        if reason is None:
            return None
        s = _state(self._probes, self.bounds.target)
        if s.failed is not None:
            ok = _state([p for p in self._probes if p.ok], self.bounds.target)
            return SearchResult(ok.lo, ok.hi, reason, self.probes, s.failed.error)
        return SearchResult(s.lo, s.hi, reason, self.probes)


def probe_bound(bounds: SearchBounds) -> int:
    """Most probes a noiseless search can take (before the budget): the grow phase's
    G + 1 rates, B bisections, `repeats` re-probes of lo (module docstring)."""
    g = math.ceil(math.log(bounds.maximum / bounds.start) / math.log(bounds.growth) - _REL_TOL)
    b = max(0, math.ceil(math.log2(math.log(bounds.growth) / math.log(bounds.precision)) - _REL_TOL))
    return g + 1 + b + bounds.repeats
