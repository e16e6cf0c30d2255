"""The capacity search against simulated attainment curves: no server, no clock."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filledfirst.contracts.search import SearchBounds, StopReason
from filledfirst.frontier.search import CapacitySearch, ProbeOutcome, probe_bound

TOL = 1 + 1e-9


def step(knee: float):
    """Every request meets the SLO up to the knee, none beyond."""
    return lambda rate, i: 1.0 if rate <= knee else 0.0


def logistic(r50: float, k: float):
    return lambda rate, i: 1.0 / (1.0 + math.exp(k * (rate - r50)))


def noisy(knee: float, seed: int, zone: float = 1.2, flip: float = 0.3):
    """A step whose outcome flips with probability `flip` within a factor `zone` of the
    knee (a probe's luck near saturation), deterministic elsewhere."""
    rng = random.Random(seed)

    def curve(rate, i):
        held = rate <= knee
        if abs(math.log(rate / knee)) < math.log(zone) and rng.random() < flip:
            held = not held
        return 0.99 if held else 0.5
    return curve


def run(bounds: SearchBounds, curve, search: CapacitySearch | None = None):
    search = search or CapacitySearch(bounds)
    i = len(search.probes)
    while (rate := search.next_rate()) is not None:
        assert not search.finished and search.result() is None
        outcome = curve(rate, i)
        search.record(outcome if isinstance(outcome, ProbeOutcome) else ProbeOutcome(rate, outcome))
        i += 1
    assert search.finished
    return search.result()


def rates(result):
    return [p.rate for p in result.probes]


def test_monotone_step_converges_around_the_knee():
    bounds = SearchBounds(start=1, maximum=64, target=0.95, growth=2, precision=1.1, budget=12)
    res = run(bounds, step(10.0))
    assert res.reason is StopReason.CONVERGED
    assert res.lo <= 10.0 < res.hi and res.ratio <= 1.1
    # grow 1..16, then bisect [8, 16] geometrically
    assert rates(res)[:5] == [1, 2, 4, 8, 16]
    assert rates(res)[5] == pytest.approx(math.sqrt(8 * 16))
    assert len(res.probes) <= probe_bound(bounds) == 7 + 3
    assert all(p.ok for p in res.probes) and res.error is None


def test_smooth_logistic_brackets_the_rate_where_attainment_crosses_the_target():
    r50, k = 20.0, 0.8
    crossing = r50 - math.log(19) / k  # attainment 0.95 exactly
    bounds = SearchBounds(start=0.5, maximum=200, target=0.95, precision=1.05, budget=20)
    res = run(bounds, logistic(r50, k))
    assert res.reason is StopReason.CONVERGED
    assert res.lo <= crossing < res.hi and res.ratio <= 1.05
    assert len(res.probes) <= probe_bound(bounds)


def test_holds_at_the_maximum():
    bounds = SearchBounds(start=1, maximum=10, growth=2, budget=10)
    res = run(bounds, step(1000.0))
    assert res.reason is StopReason.HOLDS_AT_MAXIMUM
    assert rates(res) == [1, 2, 4, 8, 10]  # the last grown rate is clamped to the maximum
    assert (res.lo, res.hi) == (10, None)
    assert len(res.probes) == math.ceil(math.log2(10)) + 1  # G + 1: no bisection


def test_holds_at_the_maximum_is_confirmed_by_the_repeats():
    res = run(SearchBounds(start=1, maximum=8, repeats=2, budget=10), step(1000.0))
    assert res.reason is StopReason.HOLDS_AT_MAXIMUM and rates(res) == [1, 2, 4, 8, 8, 8]


def test_breaks_at_the_start_rate():
    res = run(SearchBounds(start=2, maximum=64, repeats=2), step(1.0))
    assert res.reason is StopReason.BREAKS_AT_START
    assert (res.lo, res.hi) == (None, 2) and rates(res) == [2]


def test_a_probe_failing_outright_ends_the_search_with_its_reason():
    def curve(rate, i):
        return ProbeOutcome.failed(rate, "server exited with code -9") if i == 3 else step(100.0)(rate, i)

    search = CapacitySearch(SearchBounds(start=1, maximum=64))
    res = run(search.bounds, curve, search)
    assert res.reason is StopReason.PROBE_FAILED and res.error == "server exited with code -9"
    assert (res.lo, res.hi) == (4, None) and len(res.probes) == 4
    assert search.next_rate() is None
    with pytest.raises(ValueError, match="done"):
        search.record(ProbeOutcome(8, 1.0))


def test_the_budget_stops_the_search_with_the_bracket_so_far():
    res = run(SearchBounds(start=1, maximum=64, budget=6), step(10.0))
    assert res.reason is StopReason.BUDGET and len(res.probes) == 6
    assert (res.lo, res.hi) == (8, math.sqrt(128))  # the bracket as far as it got: 1, 2, 4, 8, 16, 11.3


def test_a_broken_repeat_at_lo_moves_the_bracket_down_and_bisection_resumes():
    outcomes = iter([1.0, 1.0, 1.0, 0.0,  # 1, 2, 4 hold, 8 breaks
                     1.0, 0.0,  # bisect [4, 8]: 5.66 holds, 6.73 breaks: 6.73 / 5.66 <= 1.2
                     0.0,  # the repeat at 5.66 breaks: the bracket is [4, 5.66]
                     1.0,  # 4.76 holds: 5.66 / 4.76 <= 1.2
                     1.0])  # and holds again on its repeat
    res = run(SearchBounds(start=1, maximum=64, precision=1.2, repeats=1, budget=20), lambda r, i: next(outcomes))
    r = rates(res)
    assert r[:6] == [1, 2, 4, 8, math.sqrt(32), math.sqrt(8 * math.sqrt(32))]
    assert r[6] == r[4]  # the repeat
    assert r[7] == math.sqrt(4 * r[4])  # bisection of [4, 5.66]
    assert r[8] == r[7] and len(r) == 9
    assert res.reason is StopReason.CONVERGED and (res.lo, res.hi) == (r[7], r[4])


@pytest.mark.parametrize("repeats", [0, 2])
def test_noisy_curve_stays_within_the_noise_band_and_the_budget(repeats):
    knee, zone = 10.0, 1.2
    bounds = SearchBounds(start=1, maximum=100, precision=1.05, repeats=repeats, budget=25)
    for seed in range(100):
        res = run(bounds, noisy(knee, seed, zone))
        assert len(res.probes) <= bounds.budget
        assert res.reason in (StopReason.CONVERGED, StopReason.BUDGET)
        # Outside the band outcomes are certain: the bracket can only err within it.
        assert res.lo is not None and res.lo <= knee * zone
        assert res.hi is not None and res.hi >= knee / zone
        if res.reason is StopReason.CONVERGED:
            assert res.ratio <= 1.05 * TOL
        assert all(1 <= r <= 100 for r in rates(res))


def test_repeats_make_an_overestimate_rarer():
    def overestimates(repeats):
        bounds = SearchBounds(start=1, maximum=100, precision=1.05, repeats=repeats, budget=30)
        return sum(run(bounds, noisy(10.0, seed)).lo > 10.0 for seed in range(200))

    assert overestimates(2) < overestimates(0) / 2


@pytest.mark.parametrize("curve", [step(10.0), logistic(20.0, 0.8), noisy(10.0, 7), noisy(10.0, 8)])
def test_resuming_from_any_prefix_gives_the_identical_remaining_sequence(curve):
    bounds = SearchBounds(start=1, maximum=100, precision=1.05, repeats=2, budget=25)
    outcomes = []
    full = run(bounds, lambda r, i: outcomes.append(curve(r, i)) or outcomes[-1])
    for k in range(len(full.probes) + 1):
        # The probes as a resumed pipeline reads them back from run.json files.
        done = [ProbeOutcome(**json.loads(json.dumps({"rate": p.rate, "attainment": p.attainment})))
                for p in full.probes[:k]]
        resumed = run(bounds, lambda r, i: outcomes[i], CapacitySearch(bounds, done))
        assert resumed == full


def test_resuming_with_other_bounds_is_refused():
    done = run(SearchBounds(start=1, maximum=64), step(10.0)).probes
    with pytest.raises(ValueError, match="bounds changed"):
        CapacitySearch(SearchBounds(start=1, maximum=64, growth=3), done)
    with pytest.raises(ValueError, match="already stopped"):
        CapacitySearch(SearchBounds(start=1, maximum=64, budget=3), done)


def test_a_probe_at_another_rate_than_proposed_is_refused():
    search = CapacitySearch(SearchBounds(start=1, maximum=64))
    with pytest.raises(ValueError, match="asked for 1/s"):
        search.record(ProbeOutcome(1.5, 1.0))
    search.record(ProbeOutcome(1 + 1e-12, 1.0))  # a float round-off is the same rate
    assert search.probes[0].rate == 1.0


@pytest.mark.parametrize("kwargs, message", [
    ({"start": 0, "maximum": 1}, "start must be > 0"),
    ({"start": 4, "maximum": 4}, "maximum must be above start"),
    ({"start": 1, "maximum": 4, "growth": 1}, "growth must be > 1"),
    ({"start": 1, "maximum": 4, "precision": 1.0}, "precision must be > 1"),
    ({"start": 1, "maximum": 4, "target": 0}, "target must be in (0, 1]"),
    ({"start": 1, "maximum": 4, "budget": 0}, "budget must be >= 1"),
    ({"start": 1, "maximum": 4, "repeats": -1}, "repeats must be >= 0"),
])
def test_bad_bounds_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        SearchBounds(**kwargs)


def test_outcome_has_an_attainment_or_an_error():
    with pytest.raises(ValueError):
        ProbeOutcome(1.0)
    with pytest.raises(ValueError):
        ProbeOutcome(1.0, 0.5, "both")
    with pytest.raises(ValueError):
        ProbeOutcome(1.0, 1.5)


# Property: a noiseless monotone curve, any knee, any bounds.


@settings(max_examples=300, deadline=None)
@given(
    start=st.floats(0.05, 20),
    span=st.floats(1.01, 2000),
    growth=st.floats(1.1, 4),
    precision=st.floats(1.005, 1.1),
    repeats=st.integers(0, 3),
    knee_at=st.floats(-0.5, 1.0),  # in log space between start (0) and maximum (1); < 0: below start
    target=st.floats(0.5, 1.0),
)
def test_property_noiseless_search_converges_within_its_bound(start, span, growth, precision, repeats, knee_at, target):
    maximum = start * span
    knee = start * span ** knee_at
    bound = probe_bound(SearchBounds(start, maximum, target, growth, precision, budget=1, repeats=repeats))
    bounds = SearchBounds(start, maximum, target, growth, precision, budget=bound, repeats=repeats)
    res = run(bounds, step(knee))
    g = math.ceil(math.log(span) / math.log(growth) - 1e-9)
    b = max(0, math.ceil(math.log2(math.log(growth) / math.log(precision)) - 1e-9))
    assert bound == g + 1 + b + repeats
    assert all(start <= r <= maximum for r in rates(res))
    assert len(res.probes) <= bound
    if knee < start:
        assert res.reason is StopReason.BREAKS_AT_START and len(res.probes) == 1
        assert (res.lo, res.hi) == (None, start)
    elif knee >= maximum:
        assert res.reason is StopReason.HOLDS_AT_MAXIMUM and (res.lo, res.hi) == (maximum, None)
        assert len(res.probes) <= g + 1 + repeats
    else:
        assert res.reason is StopReason.CONVERGED, (res.reason, rates(res))
        assert res.lo <= knee < res.hi
        assert res.ratio <= precision * TOL
        assert sum(r == res.lo for r in rates(res)) == 1 + repeats
