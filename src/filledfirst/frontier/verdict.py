"""A probe's verdict: did the server sustain this rate within the SLO?

Two tests, both on the probe's own requests:

- **Attainment, with its interval.** m of n requests met the SLO (a failed request
  missed). The share is a proportion, so it is judged by its Wilson score interval at the
  search's `confidence`: the rate holds when the interval's lower end is at or above the
  target, breaks when its upper end is below it, and is *inconclusive* when the interval
  straddles the target: the probe had too few requests to tell, and the search measures
  that rate again (the requests of every probe at one rate are pooled).
- **Backlog.** An open-loop probe above capacity builds a queue that grows for as long as
  the probe lasts; a short probe ends before the queue reaches the SLO and would hold a
  rate the server cannot sustain. So the wait for a first token (from the scheduled
  arrival) is regressed on the arrival time over the probe's last two thirds: the growth
  of the wait per second of the probe. Above `max_growth` the rate breaks whatever its
  attainment. The first third is left out because it holds the ramp from an idle server,
  whose short waits would read as growth. Over capacity by a factor rho, a queue's wait grows by rho - 1 seconds per
  second (requests arrive rho times as fast as they leave), whatever the probe's length:
  20 % over, 0.2 s/s.

A rate up to (1 + max_growth) x the capacity passes the backlog test, and the growth is
measured with noise: over a probe of four request lifetimes its spread (10th to 90th
percentile) is about +-0.035 s/s on a simulated queue (tests/frontier/test_holding_rule.py),
so a rate up to about (1 + 2 x max_growth) x the capacity can still hold now and then. A
held rate r therefore says that the capacity is at least r / (1 + 2 x max_growth)
(`interval_floor`): the knee's interval (filledfirst.frontier.search) starts there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from statistics import NormalDist


class Verdict(StrEnum):
    HELD = "held"
    BROKE = "broke"
    INCONCLUSIVE = "inconclusive"


def z_of(confidence: float) -> float:
    """The two-sided normal quantile of `confidence` (0 gives 0: the point estimate)."""
    if not (0 <= confidence < 1):
        raise ValueError(f"confidence must be in [0, 1), got {confidence}")
    return NormalDist().inv_cdf((1 + confidence) / 2) if confidence > 0 else 0.0


def wilson(met: int, n: int, confidence: float) -> tuple[float, float]:
    """The Wilson score interval of met/n at `confidence` (two-sided)."""
    if n <= 0 or not (0 <= met <= n):
        raise ValueError(f"need 0 <= met <= n and n > 0, got met={met}, n={n}")
    z = z_of(confidence)
    p = met / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # Rounding must not put an all-met probe's upper end below 1, or a none-met one's lower above 0.
    return (0.0 if met == 0 else max(0.0, centre - half)), (1.0 if met == n else min(1.0, centre + half))


def min_requests(target: float, confidence: float) -> int:
    """The fewest requests whose interval can show `target` at all: all of them meeting
    the SLO, the Wilson interval's low end n / (n + z^2) reaches the target at n = z^2 t /
    (1 - t). A probe with fewer is inconclusive even when every request met the SLO."""
    z = z_of(confidence)
    if z == 0:
        return 1
    if target >= 1:
        raise ValueError("no count of requests shows an attainment of 1 with an interval: use confidence 0")
    return math.ceil(z * z * target / (1 - target) - 1e-9)


def backlog_growth(arrivals_s: Sequence[float], waits_s: Sequence[float]) -> float | None:
    """Seconds of wait gained per second of the probe: the least-squares slope of wait
    against arrival over the requests arriving after the first third of the arrival span.
    `waits_s[i]`: request i's wait for its first token from its scheduled arrival
    `arrivals_s[i]`, math.inf if it never came (then its wait is at least the longest one
    seen: it is counted as that). math.inf when most of the last third never got a first
    token; None when fewer than 6 requests arrived after the first third (too few to tell)."""
    if len(arrivals_s) != len(waits_s):
        raise ValueError("one wait per arrival")
    if not arrivals_s:
        return None
    t0, t1 = min(arrivals_s), max(arrivals_s)
    span = t1 - t0
    if span <= 0:
        return None
    later = [(a, w) for a, w in zip(arrivals_s, waits_s) if a >= t0 + span / 3]
    last = [w for a, w in later if a >= t0 + 2 * span / 3]
    if len(later) < 6:
        return None
    if sum(math.isinf(w) for w in last) * 2 > len(last):
        return math.inf
    longest = max((w for _, w in later if not math.isinf(w)), default=0.0)
    xs = [a for a, _ in later]
    ys = [longest if math.isinf(w) else w for _, w in later]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def interval_floor(lo: float, max_growth: float | None) -> float:
    """The lowest capacity a held rate `lo` vouches for (module docstring)."""
    return lo / (1 + 2 * (max_growth or 0.0))


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: Verdict
    attainment: float
    attainment_lo: float
    attainment_hi: float
    why: str


def judge(met: int, n: int, growths: Sequence[float | None], *, target: float, confidence: float,
          max_growth: float | None) -> Judgement:
    """The verdict on a rate from its probes pooled: `met` of `n` requests met the SLO, and
    `growths` are the probes' backlog growths (None: not measured)."""
    lo, hi = wilson(met, n, confidence)
    att = met / n
    grew = [g for g in growths if g is not None and max_growth is not None and g > max_growth]
    share = f"{met}/{n} met the SLO ({att:.1%}, {confidence:.0%} interval {lo:.1%}-{hi:.1%}, target {target:.0%})"
    if grew:
        return Judgement(Verdict.BROKE, att, lo, hi,
                         f"backlog grew {max(grew):.3g} s/s (> {max_growth:g}); {share}")
    if lo >= target:
        return Judgement(Verdict.HELD, att, lo, hi, share)
    if hi < target:
        return Judgement(Verdict.BROKE, att, lo, hi, share)
    return Judgement(Verdict.INCONCLUSIVE, att, lo, hi, share)
