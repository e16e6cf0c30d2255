"""Arrival processes: seeded, with the asked mean gap and scatter."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filledfirst.workloads.arrivals import arrival_times
from filledfirst.workloads.synthetic import synthetic_schedule


@pytest.mark.parametrize("process, cv", [("constant", 0.0), ("poisson", 1.0), ("gamma", 0.5), ("gamma", 3.0)])
def test_mean_gap_and_scatter(process, cv):
    t = arrival_times(20_000, 2.0, 0.1, process, cv=cv or 1.0, seed=7)
    gaps = np.diff(t)
    assert t[0] == 2.0 and (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(0.1, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, abs=0.1 * max(cv, 1))


@given(count=st.integers(1, 200), seed=st.integers(0, 2**32 - 1), process=st.sampled_from(["poisson", "gamma"]))
@settings(max_examples=50, deadline=None)
def test_seeded_and_sorted(count, seed, process):
    a = arrival_times(count, 0.0, 0.05, process, cv=2.0, seed=seed)
    assert np.array_equal(a, arrival_times(count, 0.0, 0.05, process, cv=2.0, seed=seed))
    assert len(a) == count and (np.diff(a) >= 0).all()


def test_phases_draw_from_their_own_seed():
    one = {"kind": "synthetic", "seed": 3, "phases": [
        {"role": "a", "count": 50, "interval_s": 0.1, "prompt_tokens": 5, "output_tokens": 5, "arrival": "poisson"}]}
    two = {**one, "phases": [*one["phases"],
        {"role": "b", "count": 5, "interval_s": 1, "prompt_tokens": 5, "output_tokens": 5,
         "arrival": "gamma", "cv": 2}]}
    a = synthetic_schedule(one)
    b = synthetic_schedule(two).filter(role="a")
    assert a["t_offset_s"].to_list() == b["t_offset_s"].to_list()


def test_unknown_process_is_an_error():
    with pytest.raises(ValueError, match="weibull"):
        arrival_times(3, 0, 1, "weibull")
