"""A workload's shape at a probe's rate: synthetic phases rescaled, a trace's time_scale."""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

import msgspec
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filledfirst.contracts.stats import ScheduleStats, stats_path
from filledfirst.errors import UserError
from filledfirst.frontier.probes import (
    TraceProbe,
    offered_rate,
    shape_rate,
    synthetic_probe,
    synthetic_probe_schedule,
    trace_kept_rate,
    trace_probe,
    trace_time_scale,
)
from filledfirst.study import TraceWorkload, Workload
from filledfirst.trace.subsample import stretches_to_parquet, subsample_to_parquet, window_of


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


def shape_schedule(csv: Path, shape: TraceWorkload, tmp_path: Path) -> tuple[pl.DataFrame, ScheduleStats]:
    """The shape's own schedule at time_scale 1 (offsets are trace seconds from the window's
    start), and its stats as a pipeline reads them back."""
    out = tmp_path / "shape.parquet"
    subsample_to_parquet(csv, out, **window_of(shape), time_scale=1.0)
    return pl.read_parquet(out), ScheduleStats.load(stats_path(out))


def probe_schedule(csv: Path, probe: TraceProbe, tmp_path: Path) -> tuple[pl.DataFrame, ScheduleStats]:
    out = tmp_path / "probe.parquet"
    written = probe.write(csv, out)
    read = ScheduleStats.load(stats_path(out))
    assert (read.requests, read.stretches) == (written.requests, written.stretches)
    return pl.read_parquet(out), read


def in_trace_time(df: pl.DataFrame, probe: TraceProbe, probe_s: float) -> list[float]:
    """Each arrival of a probe, back in trace seconds from the window's start."""
    part_s, scale = probe_s / len(probe.starts_s), float(probe.workload.time_scale)
    out = []
    for t in df["t_offset_s"]:
        i = min(int(t / part_s + 1e-9), len(probe.starts_s) - 1)
        out.append(probe.starts_s[i] + (t - i * part_s) / scale)
    return out


def assert_in_arrival_order(df: pl.DataFrame) -> None:
    assert df["request_id"].to_list() == list(range(df.height))
    assert df["t_offset_s"].is_sorted()


def test_a_uniform_trace_probe_takes_stretches_of_the_window_end_to_end(tmp_path):
    csv = write_trace(tmp_path / "t.csv", [0.1] * 6000)  # 10 requests/s for 10 minutes
    kept = trace_kept_rate(shape_schedule(csv, TRACE_SHAPE, tmp_path)[1])
    assert kept == pytest.approx(2.5)  # every 4th, whatever the shape's own time_scale
    assert trace_time_scale(kept, 10.0) == pytest.approx(0.25)
    counts = {}
    for rate in (10.0, 5.0):
        probe = trace_probe(TRACE_SHAPE, kept, rate=rate, probe_s=16.0, stretches=4)
        # 16 s at time scale 2.5 / rate: 4 stretches of rate * 1.6 trace seconds, one per 30 s of the window
        assert probe.starts_s == (0.0, 30.0, 60.0, 90.0) and probe.stretch_s == pytest.approx(rate * 1.6)
        assert probe.workload == msgspec.structs.replace(TRACE_SHAPE, time_scale=pytest.approx(2.5 / rate))
        df, stats = probe_schedule(csv, probe, tmp_path)
        assert_in_arrival_order(df)
        # The window's own every 4th row: stretches start at rows 0, 300, 600, 900, so each keeps a quarter.
        assert [w.start_offset_s for w in stats.stretches] == [0.0, 30.0, 60.0, 90.0]
        assert [w.requests for w in stats.stretches] == [round(rate * 16)] * 4
        assert (stats.requests, stats.duration_s, stats.time_scale) == (rate * 16, pytest.approx(16.0),
                                                                        pytest.approx(2.5 / rate))
        assert offered_rate(stats, 16.0) == rate
        # End to end: one gap of 0.4 trace seconds scaled throughout, none lost or doubled at the joins.
        assert df["t_offset_s"].diff().drop_nulls().to_numpy() == pytest.approx(1 / rate, abs=1e-6)
        assert in_trace_time(df, probe, 16.0)[::df.height // 4] == pytest.approx([0.0, 30.0, 60.0, 90.0])
        counts[rate] = df.height
    assert counts == {10.0: 160, 5.0: 80}


def test_a_probe_covering_the_window_is_one_stretch_from_its_start(tmp_path):
    csv = write_trace(tmp_path / "t.csv", [0.1] * 6000)
    kept = 2.5
    # 30 s at 10/s is 120 trace seconds: 4 stretches of 30 s would meet end to end, so the window itself
    assert trace_probe(TRACE_SHAPE, kept, rate=10.0, probe_s=30.0, stretches=4).starts_s == (0.0,)
    assert len(trace_probe(TRACE_SHAPE, kept, rate=9.9, probe_s=30.0, stretches=4).starts_s) == 4
    assert len(trace_probe(TRACE_SHAPE, kept, rate=1.0, probe_s=30.0, stretches=1).starts_s) == 1
    probe = trace_probe(TRACE_SHAPE, kept, rate=40.0, probe_s=30.0, stretches=4)
    assert (probe.starts_s, probe.stretch_s, probe.workload.minutes) == ((0.0,), pytest.approx(480.0),
                                                                         pytest.approx(8.0))
    df, stats = probe_schedule(csv, probe, tmp_path)
    assert_in_arrival_order(df)
    assert [(w.start_offset_s, w.requests) for w in stats.stretches] == [(0.0, 4800)]
    assert stats.window.minutes == pytest.approx(8.0)  # past the window: the probe reads what it replays
    assert stats.requests == 1200 and df["t_offset_s"].max() < 30.0


@pytest.mark.parametrize("rate", [1.0, 5.0, 40.0])
def test_a_random_trace_probe_offers_about_the_rate(tmp_path, rate):
    rng = random.Random(5)
    csv = write_trace(tmp_path / "t.csv", [rng.expovariate(10.0) for _ in range(12000)])
    kept = trace_kept_rate(shape_schedule(csv, TRACE_SHAPE, tmp_path)[1])
    df, stats = probe_schedule(csv, trace_probe(TRACE_SHAPE, kept, rate, probe_s=30.0, stretches=4), tmp_path)
    assert df["t_offset_s"].max() < 30.0
    assert offered_rate(stats, 30.0) == pytest.approx(rate, rel=0.25)


def test_bad_trace_probes_are_refused(tmp_path):
    with pytest.raises(ValueError, match="rate must be > 0"):
        trace_time_scale(2.0, 0.0)
    with pytest.raises(ValueError, match="kept_per_s must be > 0"):
        trace_time_scale(0.0, 1.0)
    with pytest.raises(ValueError, match="no rate to scale"):
        trace_kept_rate(ScheduleStats(requests=0, duration_s=60.0, time_scale=1.0))
    with pytest.raises(ValueError, match="at least one stretch"):
        trace_probe(TRACE_SHAPE, 2.5, 1.0, 10.0, stretches=0)
    csv = write_trace(tmp_path / "t.csv", [0.1] * 100)
    with pytest.raises(UserError, match="without overlap"):
        stretches_to_parquet(csv, tmp_path / "p.parquet", starts_s=[0.0, 5.0], stretch_s=6.0, minutes=1)
    with pytest.raises(UserError, match="no request kept: 2 stretch"):
        stretches_to_parquet(csv, tmp_path / "p.parquet", starts_s=[0.0, 5.0], stretch_s=0.05, minutes=1,
                             keep_every=4, phase=3)


# The 2023 conversation trace, from ten minutes in: 40 minutes, every 10th request.
CONV_SHAPE = typed({"kind": "trace", "trace": "azure2023_conv", "minutes": 40, "start_offset_s": 600,
                    "keep_every": 10})


def test_probes_of_the_real_trace_sample_the_whole_window_at_their_rate(conv_trace, tmp_path):
    shape_df, shape = shape_schedule(conv_trace, CONV_SHAPE, tmp_path)
    kept, window_s, probe_s = trace_kept_rate(shape), 2400.0, 30.0
    shape_t = shape_df["t_offset_s"].to_list()
    held = {}
    for rate in (2.0, 1.6, 1.3, 1.09):  # a bracket closing in, as a search probes it
        probe = trace_probe(CONV_SHAPE, kept, rate, probe_s, stretches=4)
        df, stats = probe_schedule(conv_trace, probe, tmp_path)
        assert_in_arrival_order(df)
        assert probe.starts_s == tuple(window_s * i / 4 for i in range(4))
        assert [w.start_offset_s for w in stats.stretches] == [600.0 + s for s in probe.starts_s]
        # The probe holds exactly the shape's own requests that fall in its stretches, in order.
        t = in_trace_time(df, probe, probe_s)
        inside = [i for i, x in enumerate(shape_t) if any(s <= x < s + probe.stretch_s for s in probe.starts_s)]
        assert t == pytest.approx([shape_t[i] for i in inside], abs=1e-6)
        assert df["prompt_tokens"].to_list() == [shape_df["prompt_tokens"][i] for i in inside]
        # Every quarter of the window is offered, from its start: stretch i's first arrival is
        # the window's first kept request at or after W * i / 4 (about 0.6 are kept per trace second).
        for s in probe.starts_s:
            first = min(x for x in t if x >= s)
            assert first < s + min(probe.stretch_s, 10.0)
        # If arrivals were Poisson, a count of about rate x 30 has sd sqrt(rate x 30): within 3 of them.
        assert abs(stats.requests - rate * probe_s) <= 3 * math.sqrt(rate * probe_s)
        held[rate] = {round(x, 4) for x in t}
    counts = [len(held[r]) for r in (2.0, 1.6, 1.3, 1.09)]
    assert counts == sorted(counts, reverse=True) and len(set(counts)) == 4  # not the same requests
    assert held[1.09] < held[2.0]  # the slower probe's stretches are the first part of the faster's


def test_real_trace_probe_counts_follow_the_rate(conv_trace, tmp_path):
    """At half the rate, each stretch is the first half of the faster probe's: counts c and
    c + c' with c, c' of about 60 each. As Poisson counts, c'/c has sd about sqrt(1/60 + 1/60)
    = 0.18, so the ratio of counts is 2 within 0.55 (three sd)."""
    kept = trace_kept_rate(shape_schedule(conv_trace, CONV_SHAPE, tmp_path)[1])
    fast, slow = (probe_schedule(conv_trace, trace_probe(CONV_SHAPE, kept, r, 60.0, stretches=4), tmp_path)[1]
                  for r in (2.0, 1.0))
    assert abs(fast.requests / slow.requests - 2.0) <= 0.55


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


def test_a_probe_lasts_long_enough_for_its_interval_to_show_the_target():
    from filledfirst.frontier.probes import probe_duration

    assert probe_duration(10, 4, 120, [], rate=2.0, min_requests=52) == 26  # 52 requests at 2/s
    assert probe_duration(10, 4, 120, [], rate=20.0, min_requests=52) == 10  # probe_s has them
    assert probe_duration(10, 4, 120, [], rate=0.1, min_requests=52) == 120  # capped
