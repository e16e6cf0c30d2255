"""A workload's shape at a probe's rate: synthetic phases rescaled, a trace's time_scale."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

import msgspec
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filledfirst.contracts.stats import ScheduleStats, stats_path
from filledfirst.frontier.probes import (
    shape_rate,
    synthetic_probe,
    synthetic_probe_schedule,
    trace_kept_rate,
    trace_probe,
    trace_time_scale,
)
from filledfirst.study import TraceWorkload, Workload
from filledfirst.trace.subsample import subsample, subsample_to_parquet, window_of


def typed(workload: dict) -> Workload:
    """A workload of the config, as the search gets it (filledfirst.study)."""
    return msgspec.convert(workload, Workload)


INTERFERENCE = typed({
    "kind": "synthetic",
    "phases": [
        {"role": "decode", "count": 12, "interval_s": 0.5, "prompt_tokens": 150, "output_tokens": 1500},
        {"role": "long", "count": 3, "start_s": 2.0, "interval_s": 2.0, "prompt_tokens": 4000, "output_tokens": 16},
        {"role": "probe", "count": 32, "interval_s": 0.25, "prompt_tokens": 64, "output_tokens": 16},
    ],
})


def test_one_constant_phase_at_the_probe_rate_for_probe_s():
    shape = typed({"kind": "synthetic", "phases": [
        {"role": "decode", "count": 10, "interval_s": 0.5, "prompt_tokens": 150, "output_tokens": 160}]})
    assert shape_rate(shape) == 2.0
    probe = synthetic_probe(shape, rate=4.0, probe_s=15.0)
    assert probe.phases == [msgspec.structs.replace(shape.phases[0], count=60, interval_s=0.25)]
    df = synthetic_probe_schedule(shape, 4.0, 15.0)
    assert df.height == 60 and df["t_offset_s"][0] == 0.0 and df["t_offset_s"][-1] == 14.75
    assert df["prompt_tokens"].unique().to_list() == [150] and df["output_tokens"].unique().to_list() == [160]


def test_phases_keep_their_share_place_and_relative_rate():
    span, n = 8.0, 47  # the long prompts and the probes end at 8 s
    assert shape_rate(INTERFERENCE) == n / span
    rate, probe_s = 10.0, 15.0
    probe = synthetic_probe(INTERFERENCE, rate, probe_s)
    counts = [p.count for p in probe.phases]
    assert counts == [round(c * rate * probe_s / n) for c in (12, 3, 32)] == [38, 10, 102]
    assert sum(counts) == rate * probe_s
    assert [p.start_s for p in probe.phases] == [0.0, 2.0 * probe_s / span, 0.0]
    assert [(p.role, p.prompt_tokens, p.output_tokens) for p in probe.phases] == [
        (p.role, p.prompt_tokens, p.output_tokens) for p in INTERFERENCE.phases]
    # Every gap stretched by the same factor: the phases' rates keep their ratios.
    k = (n / span) / rate
    assert [p.interval_s for p in probe.phases] == pytest.approx([0.5 * k, 2.0 * k, 0.25 * k])
    df = synthetic_probe_schedule(INTERFERENCE, rate, probe_s)
    assert df.height == 150 and df["t_offset_s"].max() < probe_s
    assert df.group_by("role").len().sort("role").rows() == [("decode", 38), ("long", 10), ("probe", 102)]


def test_a_random_arrival_process_keeps_its_seed_and_scales_its_mean_gap():
    shape = typed({"kind": "synthetic", "seed": 3, "phases": [
        {"role": "a", "count": 100, "interval_s": 0.2, "arrival": "gamma", "cv": 2.0,
         "prompt_tokens": 8, "output_tokens": 8}]})
    probe = synthetic_probe(shape, rate=20.0, probe_s=60.0)
    assert probe.seed == 3 and probe.phases[0].cv == 2.0 and probe.phases[0].arrival == "gamma"
    assert probe.phases[0].count == 1200 and probe.phases[0].interval_s == pytest.approx(0.05)
    t = synthetic_probe_schedule(shape, 20.0, 60.0)["t_offset_s"]
    assert t.diff().drop_nulls().mean() == pytest.approx(0.05, rel=0.15)


def test_a_very_low_rate_keeps_one_request_per_phase():
    probe = synthetic_probe(INTERFERENCE, rate=0.01, probe_s=15.0)
    assert [p.count for p in probe.phases] == [1, 1, 1]


def test_bad_probes_are_refused():
    with pytest.raises(ValueError, match="rate must be > 0"):
        synthetic_probe(INTERFERENCE, 0.0, 15)
    with pytest.raises(ValueError, match="duration must be > 0"):
        synthetic_probe(INTERFERENCE, 1.0, 0)
    burst = typed({"kind": "synthetic", "phases": [{"role": "a", "count": 5, "prompt_tokens": 8, "output_tokens": 8}]})
    with pytest.raises(ValueError, match="all its requests at once"):
        synthetic_probe(burst, 1.0, 15)


phase_st = st.fixed_dictionaries({
    "role": st.sampled_from(["a", "b"]),
    "count": st.integers(1, 50),
    "start_s": st.floats(0, 20),
    "interval_s": st.floats(0.01, 5),
    "prompt_tokens": st.just(8),
    "output_tokens": st.just(8),
})


@settings(max_examples=100, deadline=None)
@given(phases=st.lists(phase_st, min_size=1, max_size=4), rate=st.floats(0.1, 50), probe_s=st.floats(1, 60))
def test_property_probe_offers_the_rate_for_probe_s(phases, rate, probe_s):
    shape = typed({"kind": "synthetic", "phases": phases})
    probe = synthetic_probe(shape, rate, probe_s)
    df = synthetic_probe_schedule(shape, rate, probe_s)
    # Counts are rounded per phase (and at least one each).
    assert abs(df.height - rate * probe_s) <= len(phases) / 2 + sum(p.count == 1 for p in probe.phases)
    # Each phase ends where it ended in the shape, scaled, up to half a gap of rounding.
    last_gap = max(p.interval_s for p in probe.phases)
    assert df["t_offset_s"].max() <= probe_s + last_gap / 2 + 1e-9


# --- traces ---------------------------------------------------------------------

T0 = datetime(2024, 5, 12, tzinfo=timezone.utc)


def write_trace(path: Path, gaps_s: list[float]) -> Path:
    t, lines = 0.0, ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for gap in gaps_s:
        ts = T0 + timedelta(microseconds=round(t * 1e6))
        lines.append(f"{ts.strftime('%Y-%m-%d %H:%M:%S')}.{ts.microsecond:06d}+00:00,100,20")
        t += gap
    path.write_text("\n".join(lines) + "\n")
    return path


TRACE_SHAPE = typed({"kind": "trace", "trace": "t", "minutes": 2, "keep_every": 4, "time_scale": 0.5})


def shape_stats(csv: Path, tmp_path: Path) -> ScheduleStats:
    out = tmp_path / "shape.parquet"
    subsample_to_parquet(csv, out, **window_of(TRACE_SHAPE), time_scale=TRACE_SHAPE.time_scale)
    return ScheduleStats.load(stats_path(out))  # as a pipeline reads it back


def probe_of(csv: Path, probe: TraceWorkload) -> pl.DataFrame:
    return subsample(csv, **window_of(probe), time_scale=probe.time_scale)


def test_a_uniform_trace_probe_offers_the_rate_for_probe_s(tmp_path):
    csv = write_trace(tmp_path / "t.csv", [0.1] * 6000)  # 10 requests/s for 10 minutes
    kept = trace_kept_rate(shape_stats(csv, tmp_path))
    assert kept == pytest.approx(2.5)  # every 4th, whatever the shape's own time_scale
    assert trace_time_scale(kept, 10.0) == pytest.approx(0.25)
    probe = trace_probe(TRACE_SHAPE, kept, rate=10.0, probe_s=15.0)
    assert (probe.time_scale, probe.minutes) == (pytest.approx(0.25), pytest.approx(1.0))
    assert probe == msgspec.structs.replace(TRACE_SHAPE, time_scale=probe.time_scale, minutes=probe.minutes)
    df = probe_of(csv, probe)
    assert df.height == 150 and df["t_offset_s"].max() < 15.0
    assert df["t_offset_s"].diff().drop_nulls().to_numpy() == pytest.approx(0.1, abs=1e-6)


@pytest.mark.parametrize("rate", [1.0, 5.0, 40.0])
def test_a_random_trace_probe_offers_about_the_rate(tmp_path, rate):
    rng = random.Random(5)
    csv = write_trace(tmp_path / "t.csv", [rng.expovariate(10.0) for _ in range(12000)])
    kept = trace_kept_rate(shape_stats(csv, tmp_path))
    df = probe_of(csv, trace_probe(TRACE_SHAPE, kept, rate, probe_s=30.0))
    assert df["t_offset_s"].max() < 30.0
    assert df.height / 30.0 == pytest.approx(rate, rel=0.25)


def test_bad_trace_rates_are_refused():
    with pytest.raises(ValueError, match="rate must be > 0"):
        trace_time_scale(2.0, 0.0)
    with pytest.raises(ValueError, match="kept_per_s must be > 0"):
        trace_time_scale(0.0, 1.0)
    with pytest.raises(ValueError, match="no rate to scale"):
        trace_kept_rate(ScheduleStats(requests=0, duration_s=60.0, time_scale=1.0))


def test_a_probe_lasts_its_lifetimes_of_the_highest_rate_that_held():
    from filledfirst.frontier.probes import probe_duration

    assert probe_duration(10, 4, 120, []) == 10  # nothing measured yet
    assert probe_duration(10, 4, 120, [(1, True, 1.0)]) == 10  # 4 lifetimes are shorter
    assert probe_duration(10, 4, 120, [(1, True, 5.0)]) == 20
    # the highest rate that held, not a broken probe's queue-inflated lifetime
    assert probe_duration(10, 4, 120, [(1, True, 5.0), (4, False, 60.0), (2, True, 6.0)]) == 24
    assert probe_duration(10, 4, 120, [(1, True, 50.0)]) == 120  # capped
    assert probe_duration(10, 0, 120, [(1, True, 50.0)]) == 10  # off
    assert probe_duration(10, 4, 120, [(1, None, None), (1, False, 9.0)]) == 10  # no held probe
