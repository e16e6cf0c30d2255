"""The holding rule and the knee's interval against simulated servers with a known
capacity (helpers/queue_server.py): a queue of `slots` requests served at once, lifetimes
with noise. What the design guarantees, not what one seed happened to do: a rate over
capacity never holds whatever the probe's length, the interval covers the capacity in at
least 90 % of seeded searches, an inconclusive probe is repeated, and a search from a
capacity estimate needs fewer probes than one growing from `start`."""

from __future__ import annotations

import math
import random

import pytest

from filledfirst.contracts.search import SearchBounds, StopReason
from filledfirst.frontier.probes import probe_duration
from filledfirst.frontier.search import CapacitySearch, ProbeOutcome
from filledfirst.frontier.verdict import Verdict, backlog_growth, judge, min_requests, wilson

from helpers.queue_server import QueueServer

TARGET = 0.95


def verdict(outcome: ProbeOutcome, bounds: SearchBounds) -> Verdict:
    met = round(outcome.attainment * outcome.requests)
    return judge(met, outcome.requests, [outcome.growth], target=bounds.target, confidence=bounds.confidence,
                 max_growth=bounds.backlog_max_growth).verdict


def search(server: QueueServer, bounds: SearchBounds, seed: int, *, estimate: bool,
           probe_s: float = 10.0, lifetimes: float = 4.0) -> tuple[CapacitySearch, int]:
    """A whole search as the runner drives it (probe lengths from the lifetimes of the
    held probes); returns the search and the runs it took (the estimate's two closed
    loops count as runs)."""
    first = server.closed_loop(3, seed) if estimate else None
    s = CapacitySearch(bounds, first=first)
    done: list[tuple[float, bool | None, float | None]] = []
    while (rate := s.next_rate()) is not None:
        length = probe_duration(probe_s, lifetimes, 120.0, done, rate, min_requests(bounds.target, bounds.confidence))
        outcome = server.probe(rate, length, seed * 1000 + len(s.probes))
        s.record(outcome)
        done.append((rate, verdict(outcome, bounds) is Verdict.HELD, server.life_s))
    return s, len(s.probes) + (2 if estimate else 0)


BOUNDS = SearchBounds(start=0.5, maximum=256, target=TARGET)
# Capacities off the grid of rates a search from `start` probes (0.5 x 2^k), so that no
# probe lands on the capacity itself.
SERVERS = [QueueServer(life_s=1.9), QueueServer(slots=64, life_s=7.3, cv=0.3),
           QueueServer(slots=4, life_s=0.55, cv=0.2, slo_ttft_s=1.0)]


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("lifetimes", [2, 4, 10, 60])
def test_a_rate_20_percent_over_capacity_never_holds_whatever_the_probe_length(server, lifetimes):
    rate = 1.2 * server.capacity
    for seed in range(40):
        outcome = server.probe(rate, lifetimes * server.life_s, seed)
        assert verdict(outcome, BOUNDS) is not Verdict.HELD, (lifetimes, seed, outcome)


def test_without_the_backlog_test_a_short_probe_holds_an_overload():
    """What the backlog test is for: 1.2x capacity for four lifetimes builds a queue
    shorter than the TTFT SLO, so attainment alone holds it."""
    server = QueueServer()
    outcome = server.probe(1.2 * server.capacity, 4 * server.life_s, 0)
    assert outcome.attainment == 1.0
    no_backlog = SearchBounds(start=0.5, maximum=256, target=TARGET, backlog_max_growth=None)
    assert verdict(outcome, no_backlog) is Verdict.HELD
    assert verdict(outcome, BOUNDS) is Verdict.BROKE and outcome.growth > 0.1


@pytest.mark.parametrize("server", SERVERS)
def test_a_rate_well_under_capacity_holds(server):
    for seed in range(20):
        rate = 0.8 * server.capacity
        length = probe_duration(4 * server.life_s, 0, 120, [], rate, min_requests(TARGET, 0.9))  # enough to tell
        outcome = server.probe(rate, length, seed)
        assert verdict(outcome, BOUNDS) is Verdict.HELD


@pytest.mark.parametrize("estimate", [True, False])
@pytest.mark.parametrize("server", SERVERS)
def test_the_knee_interval_covers_the_capacity_in_90_percent_of_seeded_searches(server, estimate):
    covered, runs = 0, 100
    for seed in range(runs):
        s, _ = search(server, BOUNDS, seed, estimate=estimate)
        r = s.result()
        assert r.reason is StopReason.CONVERGED, (seed, r)
        assert r.confidence == 0.9 and r.floor == pytest.approx(r.lo / 1.1)
        covered += r.floor <= server.capacity < r.hi
    assert covered >= 0.9 * runs


def test_the_search_from_an_estimate_takes_fewer_runs_than_growing_from_start():
    for server in SERVERS:
        runs = {est: sum(search(server, BOUNDS, seed, estimate=est)[1] for seed in range(30)) / 30
                for est in (True, False)}
        assert runs[True] < runs[False], (server, runs)


def test_an_inconclusive_probe_is_repeated_and_its_requests_pooled():
    """20 requests all meeting the SLO cannot show 95 % at 90 % confidence (the interval's
    low end is 0.88): the rate is probed again, and held once the pooled requests show it."""
    bounds = SearchBounds(start=1, maximum=64, target=TARGET, extensions=2)
    assert wilson(20, 20, 0.9)[0] < TARGET <= wilson(60, 60, 0.9)[0]
    s = CapacitySearch(bounds)
    s.record(ProbeOutcome(1, 1.0, requests=20))
    assert s.next_rate() == 1  # inconclusive: again
    s.record(ProbeOutcome(1, 1.0, requests=20))
    assert s.next_rate() == 1
    s.record(ProbeOutcome(1, 1.0, requests=20))
    assert s.verdicts()[1.0].verdict is Verdict.HELD and s.next_rate() == 2  # 60 of 60: held, grow


def test_a_rate_still_inconclusive_after_its_extensions_counts_as_broken_and_says_so():
    bounds = SearchBounds(start=1, maximum=64, target=TARGET, extensions=1, precision=1.1, growth=2)
    s = CapacitySearch(bounds)
    for rate, outcomes in ((1, [1.0]), (2, [1.0])):
        for att in outcomes:
            s.record(ProbeOutcome(rate, att, requests=500))
    s.record(ProbeOutcome(4, 0.94, requests=200))  # 0.94 of 200: interval straddles 0.95
    assert s.next_rate() == 4
    s.record(ProbeOutcome(4, 0.95, requests=200))  # pooled 0.945 of 400: still straddles
    assert s.verdicts()[4.0].verdict is Verdict.INCONCLUSIVE
    assert s.next_rate() == pytest.approx(math.sqrt(8))  # 4 counts as broken: bisect [2, 4]
    while (rate := s.next_rate()) is not None:
        s.record(ProbeOutcome(rate, 1.0, requests=500))
    r = s.result()
    assert r.hi == 4 and r.hi_inconclusive


def test_the_backlog_of_a_steady_queue_does_not_grow_and_of_an_overloaded_one_grows_at_rho_minus_1():
    server = QueueServer(cv=0.0)
    for rho in (1.2, 1.5, 2.0):
        rate = rho * server.capacity
        arrivals = [i / rate for i in range(round(rate * 60))]
        assert backlog_growth(arrivals, server.waits(arrivals, random.Random(0))) == pytest.approx(rho - 1, rel=0.05)
    arrivals = [i / (0.9 * server.capacity) for i in range(round(0.9 * server.capacity * 60))]
    assert backlog_growth(arrivals, server.waits(arrivals, random.Random(0))) == pytest.approx(0, abs=1e-9)


def test_a_probe_whose_last_third_got_no_first_token_grew_without_bound():
    arrivals = [float(i) for i in range(30)]
    waits = [0.1] * 20 + [math.inf] * 10
    assert backlog_growth(arrivals, waits) == math.inf
    assert backlog_growth(arrivals[:5], waits[:5]) is None  # too few requests per third


@pytest.mark.parametrize("met, n", [(0, 10), (10, 10), (95, 100), (1, 3)])
def test_wilson_interval_holds_the_share_and_shrinks_with_n(met, n):
    lo, hi = wilson(met, n, 0.9)
    assert 0 <= lo <= met / n <= hi <= 1
    lo4, hi4 = wilson(met * 4, n * 4, 0.9)
    assert hi4 - lo4 < hi - lo
    assert wilson(met, n, 0.0) == (met / n, met / n)


def test_from_an_estimate_the_bracket_step_is_squared_at_each_move():
    """A poor estimate (a third of the knee) costs few probes: 1.25, 1.56, 2.44, ..."""
    bounds = SearchBounds(start=0.5, maximum=256, target=TARGET)
    s = CapacitySearch(bounds, first=2.0)
    while (rate := s.next_rate()) is not None:
        s.record(ProbeOutcome(rate, 1.0 if rate <= 6.0 else 0.0))
    rates = [p.rate for p in s.probes]
    assert rates[:3] == pytest.approx([2.0, 2.5, 2.5 * 1.25 ** 2])
    assert rates[3] == pytest.approx(rates[2] * 1.25 ** 4)  # 7.63: broke
    r = s.result()
    assert r.reason is StopReason.CONVERGED and r.lo <= 6.0 < r.hi and len(rates) == 8
