"""Capacity search over offered rate: which rate to probe next, and when to stop.

A pure, deterministic state machine. The runner asks `next_rate()`, runs an open-loop
probe at that rate, and hands back the outcome with `record()`, until `done`; then
`result()` is the bracket. Nothing here reads a clock, a file or a random number.

A rate's verdict pools every probe at that rate (filledfirst.frontier.verdict): its
requests' attainment judged by its interval at `confidence`, and its backlog's growth.
It *holds*, *breaks*, or is *inconclusive*; an inconclusive rate is probed again, up to
`extensions` more times, and a rate still inconclusive after them counts as broken
(the knee is a rate shown to hold) and is flagged in the result.

Phases (all rates in requests per second), from the first rate: `start`, or a measured
capacity estimate (`CapacitySearch(..., first=)`, clamped to [start, maximum]):

1. bracket: while every rate held, grow by the step (the last one clamped to
   `maximum`) until one breaks or `maximum` holds; while every rate broke, shrink by it
   (clamped to `start`) until one holds or `start` breaks. The step is `growth` from
   `start`; from an estimate it starts at `estimate_step` and is squared at each move
   (a close estimate needs a small step, a poor one should not cost many);
2. bisect geometrically: sqrt(lo*hi) until hi/lo <= precision;
3. repeats: re-probe lo until it has 1 + `repeats` probes. Should its pooled verdict
   break, lo becomes the new hi, the next lower held rate the new lo, and bisection
   resumes.

An intervention's search (`against=` its parent's knee) also stops, `decided`, once a
rate has held and one has broken and no further probe could change whether its knee
moved from the parent's (filledfirst.frontier.interventions.decided): the verdict is
what it is for, and a control that breaks just above its parent's knee has given it.

The state is a function of the probes done alone (lo = highest rate that held below hi,
hi = lowest that broke), so `CapacitySearch(bounds, done, first=)` resumes an interrupted
search exactly: it proposes what the uninterrupted search would have proposed next. The
replayed probes must be the ones this search would have asked for (same bounds, same
first rate); otherwise construction fails rather than guess.

Probe count (`probe_bound`), noiseless, from `start`, with G = ceil(log(maximum/start)/log(growth)):
  breaks at start:      1
  holds at maximum:     G + 1 + repeats
  converged:            <= G + 1 + B + repeats, B = max(0, ceil(log2(ln(growth)/ln(precision))))
(the grow phase probes at most G + 1 rates; after it hi/lo <= growth, and each bisection
halves log(hi/lo)). With noise, each broken repeat at lo can cost up to B more
bisections and `repeats` more repeats, each inconclusive rate up to `extensions` more
probes; `budget` caps the total in every case.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from filledfirst.contracts.search import ResultRecord, SearchBounds, StopReason
from filledfirst.frontier.interventions import Span, decided
from filledfirst.frontier.verdict import Judgement, Verdict, interval_floor, judge

# Relative tolerance for "the same rate": a rate read back from a probe's run.json, or
# a grown rate a rounding error below `maximum`.
_REL_TOL = 1e-9


@dataclass(frozen=True, slots=True)
class ProbeOutcome:
    """One probe: its rate and attainment, or `error` when it failed outright (then
    attainment is None and the search ends). `requests`: how many the attainment is a
    share of (None: unknown, the share is taken as exact); `growth`: its backlog's growth
    in seconds of wait per second (filledfirst.frontier.verdict.backlog_growth; None: not
    measured)."""

    rate: float
    attainment: float | None = None
    error: str | None = None
    requests: int | None = None
    growth: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate", float(self.rate))
        if (self.attainment is None) == (self.error is None):
            raise ValueError("a probe outcome has an attainment or an error, exactly one")
        if self.attainment is not None and not (0 <= self.attainment <= 1):
            raise ValueError(f"attainment must be in [0, 1], got {self.attainment}")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"a probe's attainment is a share of at least one request, got {self.requests}")

    @classmethod
    def failed(cls, rate: float, reason: str) -> ProbeOutcome:
        return cls(rate, None, reason or "failed")

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class RateVerdict:
    """The pooled verdict on one rate: `probes` probes, `judgement` of their requests
    together, and `final` (False: inconclusive with extensions left, probe it again)."""

    rate: float
    probes: int
    judgement: Judgement

    @property
    def verdict(self) -> Verdict:
        return self.judgement.verdict


def pooled(probes: list[ProbeOutcome], bounds: SearchBounds) -> Judgement:
    """The verdict on the probes of one rate, their requests pooled."""
    growths = [p.growth for p in probes]
    if all(p.requests is not None for p in probes):
        n = sum(p.requests for p in probes)
        met = sum(round(p.attainment * p.requests) for p in probes)
        return judge(met, n, growths, target=bounds.target, confidence=bounds.confidence,
                     max_growth=bounds.backlog_max_growth)
    # Shares without counts: their mean, taken as exact (no interval to judge).
    mean = sum(p.attainment for p in probes) / len(probes)
    return judge(round(mean * 1_000_000), 1_000_000, growths, target=bounds.target, confidence=0.0,
                 max_growth=bounds.backlog_max_growth)


@dataclass(frozen=True, slots=True)
class SearchResult:
    """`lo`: highest rate that held (None: none did); `hi`: lowest that broke (None: none
    did). The capacity lies in [lo, hi) for a monotone server; `floor` is where the
    knee's interval starts (filledfirst.frontier.verdict.interval_floor);
    `confidence` is the one each verdict was judged at; `hi_inconclusive`: hi never
    showed a verdict and counts as broken."""

    lo: float | None
    hi: float | None
    reason: StopReason
    probes: tuple[ProbeOutcome, ...]
    error: str | None = None  # the failed probe's reason, for PROBE_FAILED
    floor: float | None = None
    confidence: float | None = None
    hi_inconclusive: bool = False

    @property
    def ratio(self) -> float | None:
        return self.hi / self.lo if self.lo is not None and self.hi is not None else None

    def record(self) -> ResultRecord:
        """As search.json keeps it."""
        return ResultRecord(lo=self.lo, hi=self.hi, ratio=self.ratio, reason=self.reason, error=self.error,
                            floor=self.floor, confidence=self.confidence, hi_inconclusive=self.hi_inconclusive)


@dataclass(frozen=True, slots=True)
class _State:
    lo: float | None
    hi: float | None
    lo_probes: int  # probes at lo
    pending: float | None  # an inconclusive rate with extensions left
    hi_inconclusive: bool
    failed: ProbeOutcome | None


def rate_verdicts(probes: Iterable[ProbeOutcome], bounds: SearchBounds) -> dict[float, RateVerdict]:
    """Each probed rate's pooled verdict, in the order the rates were first probed."""
    by_rate: dict[float, list[ProbeOutcome]] = {}
    for p in probes:
        by_rate.setdefault(p.rate, []).append(p)
    return {rate: RateVerdict(rate, len(ps), pooled(ps, bounds)) for rate, ps in by_rate.items()}


def _state(probes: list[ProbeOutcome], bounds: SearchBounds) -> _State:
    failed = next((p for p in probes if not p.ok), None)
    if failed is not None:
        return _State(None, None, 0, None, False, failed)
    verdicts = rate_verdicts(probes, bounds)
    last = verdicts[probes[-1].rate] if probes else None
    pending = (last.rate if last is not None and last.verdict is Verdict.INCONCLUSIVE
               and last.probes <= bounds.extensions else None)
    broke = {r: v for r, v in verdicts.items() if v.verdict is not Verdict.HELD and r != pending}
    hi = min(broke, default=None)
    held = [r for r, v in verdicts.items() if v.verdict is Verdict.HELD and (hi is None or r < hi)]
    lo = max(held, default=None)
    return _State(lo, hi, verdicts[lo].probes if lo is not None else 0, pending,
                  hi is not None and broke[hi].verdict is Verdict.INCONCLUSIVE, None)


class CapacitySearch:
    """`CapacitySearch(bounds)` starts a search at `bounds.start`; `first=` starts it at a
    capacity estimate instead. `done`: the probes already done, in the order they ran (a
    resumed search). `against`: the knee an intervention's search is judged against, by
    a move of at least `min_shift` (it stops once that is decided)."""

    def __init__(self, bounds: SearchBounds, done: Iterable[ProbeOutcome] = (), *, first: float | None = None,
                 against: Span | None = None, min_shift: float = 0.0) -> None:
        self.bounds = bounds
        self.against, self.min_shift = against, min_shift
        self.first = bounds.start if first is None else min(max(float(first), bounds.start), bounds.maximum)
        self.from_start = first is None
        self.step = bounds.growth if first is None else bounds.estimate_step
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
        s = _state(self._probes, b)
        if s.failed is not None:
            return None, StopReason.PROBE_FAILED
        if not self._probes:
            rate = self.first
        elif s.pending is not None:
            rate = s.pending
        elif self._decided(s):
            return None, StopReason.DECIDED
        elif s.hi is None:  # every rate so far held: grow
            if s.lo >= b.maximum * (1 - _REL_TOL):
                if s.lo_probes > b.repeats:
                    return None, StopReason.HOLDS_AT_MAXIMUM
                rate = s.lo
            else:
                grown = s.lo * self._step()
                rate = b.maximum if grown * (1 + _REL_TOL) >= b.maximum else grown
        elif s.lo is None:  # every rate so far broke: shrink
            if s.hi <= b.start * (1 + _REL_TOL):
                return None, StopReason.BREAKS_AT_START
            shrunk = s.hi / self._step()
            rate = b.start if shrunk <= b.start * (1 + _REL_TOL) else shrunk
        elif s.hi / s.lo > b.precision * (1 + _REL_TOL):
            rate = math.sqrt(s.lo * s.hi)
        elif s.lo_probes <= b.repeats:
            rate = s.lo
        else:
            return None, StopReason.CONVERGED
        if len(self._probes) >= b.budget:
            return None, StopReason.BUDGET
        return rate, None

    def _decided(self, s: _State) -> bool:
        """Whether an intervention's move from its parent's knee can no longer change (a
        re-probe of lo could break it, so a search with repeats never stops early)."""
        if self.against is None or s.lo is None or s.hi is None or self.bounds.repeats:
            return False
        return decided(self.against, s.lo, s.hi, self.bounds.backlog_max_growth, self.min_shift) is not None

    def _step(self) -> float:
        """The bracket's next step: `growth` from start; from an estimate, `estimate_step`
        squared at each move in the same direction (1.25, 1.56, 2.44, ...), so a close
        estimate costs small steps and a poor one few probes."""
        if self.from_start:
            return self.step
        moves = len({p.rate for p in self._probes})
        return self.step ** (2 ** (moves - 1))

    def next_rate(self) -> float | None:
        """The rate to probe next, or None when the search is done."""
        return self._decide()[0]

    @property
    def finished(self) -> bool:
        return self._decide()[0] is None

    def verdicts(self) -> dict[float, RateVerdict]:
        """Each probed rate's pooled verdict so far (the failed probes left out)."""
        return rate_verdicts([p for p in self._probes if p.ok], self.bounds)

    def record(self, outcome: ProbeOutcome) -> None:
        """The outcome of the probe `next_rate()` proposed."""
        expected = self.next_rate()
        if expected is None:
            raise ValueError("the search is done: no probe to record")
        if not math.isclose(outcome.rate, expected, rel_tol=_REL_TOL):
            raise ValueError(f"probed {outcome.rate:g}/s, but the search asked for {expected:g}/s")
        # Keep the proposed rate itself, so a resumed search computes with the same floats.
        self._probes.append(ProbeOutcome(expected, outcome.attainment, outcome.error, outcome.requests,
                                         outcome.growth))

    def result(self) -> SearchResult | None:
        """The bracket and why the search stopped; None while it runs."""
        rate, reason = self._decide()
        if reason is None:
            return None
        b = self.bounds
        s = _state(self._probes, b)
        error = None
        if s.failed is not None:
            error = s.failed.error
            s = _state([p for p in self._probes if p.ok], b)
        floor = None if s.lo is None else interval_floor(s.lo, b.backlog_max_growth)
        return SearchResult(s.lo, s.hi, reason, self.probes, error, floor, b.confidence, s.hi_inconclusive)


def probe_bound(bounds: SearchBounds) -> int:
    """Most probes a noiseless search from `start` can take (before the budget): the grow
    phase's G + 1 rates, B bisections, `repeats` re-probes of lo (module docstring)."""
    g = math.ceil(math.log(bounds.maximum / bounds.start) / math.log(bounds.growth) - _REL_TOL)
    b = max(0, math.ceil(math.log2(math.log(bounds.growth) / math.log(bounds.precision)) - _REL_TOL))
    return g + 1 + b + bounds.repeats
