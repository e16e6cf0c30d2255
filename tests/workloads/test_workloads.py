"""Synthetic workloads: phases merged in time, deterministic, in the schedule schema."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filledfirst.contracts.records import SCHEDULE_SCHEMA
from filledfirst.contracts.stats import stats_path
from filledfirst.workloads.synthetic import synthetic_schedule, write_synthetic_schedule

from conftest import REPO

SPEC = {
    "kind": "synthetic",
    "phases": [
        {"role": "decode", "count": 5, "start_s": 0, "interval_s": 1.0, "prompt_tokens": 150, "output_tokens": 64},
        {"role": "burst", "count": 3, "start_s": 2.0, "interval_s": 0, "prompt_tokens": 9000, "output_tokens": 1},
        {"role": "probe", "count": 2, "start_s": 0.5, "interval_s": 2.0, "prompt_tokens": 150, "output_tokens": 32},
    ],
}


def test_phases_merge_in_time_order_with_phase_order_on_ties():
    df = synthetic_schedule(SPEC)
    assert df["request_id"].to_list() == list(range(10))
    assert list(zip(df["t_offset_s"], df["role"])) == [
        (0.0, "decode"),
        (0.5, "probe"),
        (1.0, "decode"),
        (2.0, "decode"),  # phase 0 before phase 1 at the same instant
        (2.0, "burst"),
        (2.0, "burst"),
        (2.0, "burst"),
        (2.5, "probe"),
        (3.0, "decode"),
        (4.0, "decode"),
    ]
    sizes = dict(df.group_by("role").agg(pl.col("prompt_tokens").first(), pl.len()).select("role", "len").iter_rows())
    assert sizes == {"decode": 5, "burst": 3, "probe": 2}
    assert df.filter(pl.col("role") == "burst")["prompt_tokens"].to_list() == [9000] * 3


def test_missing_start_and_interval_mean_zero():
    phase = {"role": "x", "count": 3, "prompt_tokens": 5, "output_tokens": 6}
    df = synthetic_schedule({"kind": "synthetic", "phases": [phase]})
    assert df["t_offset_s"].to_list() == [0.0, 0.0, 0.0]


def test_write_is_deterministic_and_typed(tmp_path):
    a, b = tmp_path / "a" / "s.parquet", tmp_path / "b" / "s.parquet"
    write_synthetic_schedule(SPEC, a)
    write_synthetic_schedule(SPEC, b)
    assert a.read_bytes() == b.read_bytes()
    assert pq.read_schema(a).remove_metadata().equals(SCHEDULE_SCHEMA)
    stats = json.loads(stats_path(a).read_text())
    assert stats["requests"] == 10
    assert stats["roles"] == {"burst": 3, "decode": 5, "probe": 2}
    assert stats["duration_s"] == 4.0
    assert stats["prompt_tokens"]["max"] == 9000
    assert stats["source"] == "synthetic"
    # Nothing else left beside the outputs (temp files are renamed or removed).
    assert sorted(p.name for p in a.parent.iterdir()) == ["s.parquet", "s.parquet.stats.json"]


def test_config_workloads_write(tmp_path):
    """Every synthetic workload in the shipped CPU config, through config validation; those
    placed relative to a knee at a made-up knee of 10 req/s for every search."""
    from filledfirst.config import load_study
    from filledfirst.frontier.relative import KneeFile, resolve_synthetic
    from filledfirst.study import SyntheticWorkload

    from helpers.searches import search_record

    study = load_study([REPO / "config" / "cpu.yaml"])
    knees = {f"{f}/{s}": KneeFile(Path("search.json"), search_record(f, s, lo=10.0, hi=11.0))
             for f, spec in study.frontiers.items() for s in spec.settings}
    synthetic = {n: w for n, w in study.workloads.items() if isinstance(w, SyntheticWorkload)}
    if not synthetic:
        pytest.skip("config/cpu.yaml has no synthetic workload")
    for name, spec in synthetic.items():
        out = tmp_path / f"{name}.parquet"
        spec, _ = resolve_synthetic(spec, knees)
        write_synthetic_schedule(spec, out)
        assert pq.read_table(out).num_rows == sum(p.count for p in spec.phases)


_phase = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["a", "b", "c"]),
        "count": st.integers(1, 40),
        "start_s": st.floats(0, 100, allow_nan=False),
        "interval_s": st.floats(0, 5, allow_nan=False),
        "prompt_tokens": st.integers(1, 10_000),
        "output_tokens": st.integers(1, 2_000),
    }
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_phase, min_size=1, max_size=5))
def test_property_counts_order_and_times(phases):
    spec = {"kind": "synthetic", "phases": phases}
    df = synthetic_schedule(spec)
    assert df.height == sum(p["count"] for p in phases)
    assert df["request_id"].to_list() == list(range(df.height))
    assert df["t_offset_s"].is_sorted()
    expected = sorted(p["start_s"] + k * p["interval_s"] for p in phases for k in range(p["count"]))
    assert df["t_offset_s"].to_list() == expected
    assert df.equals(synthetic_schedule(spec))


PREFIXED = {
    "kind": "synthetic",
    "phases": [
        {"role": "doc", "count": 7, "interval_s": 0.1, "prompt_tokens": 300, "output_tokens": 4,
         "shared_prefix": {"prefixes": 3, "tokens": 256}},
        {"role": "plain", "count": 2, "start_s": 0.05, "interval_s": 0.1, "prompt_tokens": 50, "output_tokens": 4},
    ],
}


def test_a_shared_prefix_is_taken_in_turn_and_an_ideal_cache_serves_it_after_its_first_request(tmp_path):
    df = synthetic_schedule(PREFIXED)
    doc = df.filter(pl.col("role") == "doc")
    ids = [b[0] for b in doc["prefix_blocks"].to_list()]
    assert ids == [ids[0], ids[1], ids[2]] * 2 + [ids[0]] and len(set(ids)) == 3
    assert doc["block_tokens"].to_list() == [256] * 7
    assert doc["ideal_cached_tokens"].to_list() == [0, 0, 0, 256, 256, 256, 256]
    plain = df.filter(pl.col("role") == "plain")
    assert plain["prefix_blocks"].to_list() == [[], []] and plain["ideal_cached_tokens"].to_list() == [0, 0]
    stats = write_synthetic_schedule(PREFIXED, tmp_path / "s.parquet")
    assert stats.block_tokens == 256
    assert stats.ideal_hit_share == pytest.approx(4 * 256 / (7 * 300 + 2 * 50))


def test_requests_of_one_prefix_send_the_same_first_tokens_and_differ_after():
    from filledfirst.contracts.records import ScheduledRequest
    from filledfirst.loadgen.prompts import completion_body
    from filledfirst.schedule import as_schedule

    rows = as_schedule(synthetic_schedule(PREFIXED)).filter(pl.col("role") == "doc").to_dicts()
    reqs = [ScheduledRequest(**r | {"prefix_blocks": tuple(r["prefix_blocks"])}) for r in rows]
    prompts = [json.loads(completion_body(r, model="m", low=10, high=2050, seed=0))["prompt"] for r in reqs]
    assert all(len(p) == 300 for p in prompts)
    assert prompts[0][:256] == prompts[3][:256] and prompts[0][256:] != prompts[3][256:]
    assert prompts[0][:256] != prompts[1][:256]


def test_a_shared_prefix_as_long_as_the_prompt_is_refused():
    from filledfirst.errors import UserError

    spec = {"kind": "synthetic", "phases": [{"role": "doc", "count": 2, "prompt_tokens": 256, "output_tokens": 4,
                                              "shared_prefix": {"prefixes": 1, "tokens": 256}}]}
    with pytest.raises(UserError, match="shared_prefix.tokens 256 must be below prompt_tokens 256"):
        synthetic_schedule(spec)
