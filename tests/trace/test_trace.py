"""Trace fetch and subsample, on the real 2023 trace and on generated 2024-format files."""

from __future__ import annotations

import calendar
import csv
import hashlib
import json
import math
import random
import re
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filledfirst.contracts.records import SCHEDULE_SCHEMA
from filledfirst.contracts.stats import stats_path
from filledfirst.errors import UserError
from filledfirst.trace.fetch import MIRROR_ENV, fetch_trace
from filledfirst.trace.subsample import subsample, subsample_to_parquet

from helpers.trace_files import DAY0, HEADER, ts2024, write_csv

CONV = "AzureLLMInferenceTrace_conv.csv"
# From FACTS.md (and config/cpu.yaml's catalog).
CONV_SHA256 = "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8"
CONV_SIZE = 719_188


def oracle_ns(ts: str) -> int:
    """An independent reading of a trace timestamp, in integer nanoseconds since 1970 UTC."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.(\d+))?(.*)", ts.strip())
    assert m, ts
    dt = datetime.fromisoformat(m[1] + (m[3] or "+00:00"))
    return calendar.timegm(dt.utctimetuple()) * 10**9 + int((m[2] or "").ljust(9, "0"))


# --- the real 2023 trace ------------------------------------------------------------


@pytest.fixture(scope="module")
def conv_rows(conv_trace):
    with conv_trace.open() as fh:
        rows = list(csv.DictReader(fh))
    ns = [oracle_ns(r["TIMESTAMP"]) for r in rows]
    assert ns == sorted(ns)
    return rows, ns


@pytest.mark.parametrize(
    "start_offset_s, minutes, keep_every, phase, time_scale",
    [(0, 10, 10, 0, 1.0), (600, 10, 10, 3, 1.0), (123.4, 7.5, 4, 1, 0.25)],
)
def test_real_trace_window(conv_trace, conv_rows, start_offset_s, minutes, keep_every, phase, time_scale):
    rows, ns = conv_rows
    start = ns[0] + round(start_offset_s * 1e9)
    end = start + round(minutes * 60 * 1e9)
    window = [i for i, t in enumerate(ns) if start <= t < end]
    kept = window[phase::keep_every]

    df = subsample(
        conv_trace, start_offset_s=start_offset_s, minutes=minutes,
        keep_every=keep_every, phase=phase, time_scale=time_scale,
    )
    assert df.height == len(kept)
    if phase == 0:
        assert df.height == math.ceil(len(window) / keep_every)
    # Gaps preserved exactly: every offset is the exact nanosecond difference, scaled.
    assert df["t_offset_s"].to_list() == [(ns[i] - start) / 1e9 * time_scale for i in kept]
    assert df["prompt_tokens"].to_list() == [max(1, int(rows[i]["ContextTokens"])) for i in kept]
    assert df["output_tokens"].to_list() == [max(1, int(rows[i]["GeneratedTokens"])) for i in kept]
    assert df["request_id"].to_list() == list(range(len(kept)))


def test_real_trace_to_parquet(conv_trace, tmp_path):
    out = tmp_path / "sched" / "conv.parquet"
    stats = subsample_to_parquet(
        conv_trace, out, start_offset_s=0, minutes=10, keep_every=10, phase=0,
        time_scale=1.0, max_model_len=4096, role="trace",
    )
    table = pq.read_table(out)
    assert table.schema.remove_metadata().equals(SCHEDULE_SCHEMA)
    assert json.loads(stats_path(out).read_text()) == stats.to_doc()
    assert stats.requests == table.num_rows
    assert stats.duration_s == 600.0
    assert stats.read == "bisect"  # only the window was read, so the row count is unknown
    assert stats.trace_requests is None
    assert stats.trace_span_s > 3500
    assert stats.clipped > 0  # the conversation trace has prompts above 4,096
    sizes = pl.from_arrow(table)
    assert (sizes["prompt_tokens"] + sizes["output_tokens"]).max() <= 4096
    for key in ("source", "window", "keep_every", "phase", "time_scale", "mean_rate_per_s",
                "prompt_tokens", "output_tokens"):
        assert key in stats.to_doc()


# --- timestamp formats --------------------------------------------------------------


def test_2024_format_mixed_fractions_exact_microseconds(tmp_path):
    rng = random.Random(11)
    offsets = sorted({0, 1_000_000, 5_000_000, *(rng.randrange(0, 3_600_000_000) for _ in range(2000))})
    offsets += [3_600_000_000 + 17]  # past a one-hour window: must be left out
    path = write_csv(tmp_path / "t.csv", [(ts2024(us), 100, 10) for us in offsets])
    text = path.read_text()
    assert "00:00:00+00:00" in text and "00:00:01+00:00" in text and re.search(r"\.\d{6}\+00:00", text)

    df = subsample(path, minutes=60)
    assert df["t_offset_s"].to_list() == [us / 1e6 for us in offsets[:-1]]


def test_2023_format_seven_digits_exact(tmp_path):
    rows = [("2023-11-16 18:15:46.0000000", 1, 1), ("2023-11-16 18:15:46.6805901", 1, 1),
            ("2023-11-16 18:16:00.0000001", 1, 1)]
    df = subsample(write_csv(tmp_path / "t.csv", rows), minutes=1)
    assert df["t_offset_s"].to_list() == [0.0, 0.6805901, 14.0000001]


def test_zone_offsets_are_applied(tmp_path):
    rows = [("2024-05-12 00:00:00+00:00", 1, 1), ("2024-05-12 02:00:01.5+02:00", 1, 1)]
    df = subsample(write_csv(tmp_path / "t.csv", rows), minutes=1)
    assert df["t_offset_s"].to_list() == [0.0, 1.5]


def test_out_of_order_rows_are_an_error_or_skipped(tmp_path):
    rows = [(ts2024(0), 1, 1), (ts2024(3_000_000), 3, 1), (ts2024(2_000_000), 2, 1), (ts2024(4_000_000), 4, 1)]
    path = write_csv(tmp_path / "t.csv", rows)
    with pytest.raises(UserError, match=r"1 row\(s\) with a TIMESTAMP earlier .* line 4"):
        subsample(path, minutes=1)
    out = tmp_path / "s.parquet"
    stats = subsample_to_parquet(path, out, minutes=1, skip_bad=True)
    df = pl.read_parquet(out)
    assert df["t_offset_s"].to_list() == [0.0, 3.0, 4.0]
    assert (stats.skipped, stats.skipped_by_reason, stats.read) == (1, {"out_of_order": 1}, "full")


def test_frame_with_datetime_column():
    frame = pl.DataFrame(
        {
            "TIMESTAMP": [DAY0, DAY0 + timedelta(microseconds=1_500_001)],
            "ContextTokens": [5, 6],
            "GeneratedTokens": [1, 2],
        }
    )
    df = subsample(frame, minutes=1)
    assert df["t_offset_s"].to_list() == [0.0, 1.500001]


def test_cli_subsample(tmp_path):
    from filledfirst.cli import main

    src = write_csv(tmp_path / "t.csv", [(ts2024(us), 100, 10) for us in range(0, 10_000_000, 500_000)])
    out = tmp_path / "s.parquet"
    argv = ["trace", "subsample", str(src), "--minutes", "1", "--keep-every", "2", "--phase", "1",
            "--time-scale", "0.5", "--out", str(out)]
    assert main(argv) == 0
    assert pl.read_parquet(out)["t_offset_s"].to_list() == [0.25 + 0.5 * k for k in range(10)]
    assert main(["trace", "subsample", str(tmp_path / "missing.csv"), "--minutes", "1", "--out", str(out)]) == 2


# --- sizes --------------------------------------------------------------------------


def test_zero_output_and_clipping(tmp_path):
    rows = [(ts2024(0), 5000, 100), (ts2024(1), 10, 5000), (ts2024(2), 1, 0), (ts2024(3), 10, 20)]
    out = tmp_path / "s.parquet"
    stats = subsample_to_parquet(
        write_csv(tmp_path / "t.csv", rows), out, start_offset_s=0, minutes=1, keep_every=1,
        phase=0, time_scale=1.0, max_model_len=1000, role="r",
    )
    df = pl.read_parquet(out)
    assert list(zip(df["prompt_tokens"], df["output_tokens"])) == [(900, 100), (1, 999), (1, 1), (10, 20)]
    assert (stats.clipped, stats.zero_output, stats.skipped) == (2, 1, 0)
    assert df["role"].to_list() == ["r"] * 4


# --- properties ---------------------------------------------------------------------


def _frame(offsets_us: list[int]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "TIMESTAMP": [ts2024(us) for us in offsets_us],
            "ContextTokens": ["7"] * len(offsets_us),
            "GeneratedTokens": ["3"] * len(offsets_us),
        }
    )


_offsets = st.lists(st.integers(0, 3_599_999_999), min_size=1, max_size=300).map(sorted)


@settings(max_examples=80, deadline=None)
@given(_offsets, st.integers(1, 25))
def test_property_keep_every_count(offsets, k):
    df = subsample(_frame(offsets), minutes=60, keep_every=k)
    assert df.height == math.ceil(len(offsets) / k)


@settings(max_examples=80, deadline=None)
@given(_offsets, st.floats(0.01, 20, allow_nan=False))
def test_property_time_scale_multiplies_every_gap(offsets, scale):
    base = subsample(_frame(offsets), minutes=60)["t_offset_s"].to_list()
    scaled = subsample(_frame(offsets), minutes=60, time_scale=scale)["t_offset_s"].to_list()
    for (a0, a1), (b0, b1) in zip(zip(base, base[1:]), zip(scaled, scaled[1:])):
        assert math.isclose(b1 - b0, (a1 - a0) * scale, rel_tol=1e-9, abs_tol=1e-9)
    assert all(math.isclose(b, a * scale, rel_tol=1e-12) for a, b in zip(base, scaled))


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 40_000), st.integers(0, 5_000)), min_size=1, max_size=60),
    st.integers(2, 33_000),
)
def test_property_clipping_never_exceeds_max_model_len(sizes, max_model_len):
    frame = pl.DataFrame({
        "TIMESTAMP": [ts2024(i * 1000) for i in range(len(sizes))],
        "ContextTokens": [str(p) for p, _ in sizes],
        "GeneratedTokens": [str(o) for _, o in sizes],
    })
    df = subsample(frame, minutes=60, max_model_len=max_model_len)
    assert df.height == len(sizes)  # clipped, never dropped
    assert ((df["prompt_tokens"] + df["output_tokens"]) <= max_model_len).all()
    assert (df["prompt_tokens"] >= 1).all() and (df["output_tokens"] >= 1).all()
    for (p, o), (p2, o2) in zip(sizes, zip(df["prompt_tokens"], df["output_tokens"])):
        if p + max(o, 1) <= max_model_len:
            assert (p2, o2) == (p, max(o, 1))  # what fits is left alone


# --- bad input ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, needle",
    [
        ("", "empty"),
        (HEADER, "no rows"),
        ("TIMESTAMP,ContextTokens\n2024-05-12 00:00:00+00:00,5\n", "GeneratedTokens"),
        (HEADER + "2024-05-12 00:00:00+00:00,5,1\n2024-05-12 00:00:01+00:00,five,1\n", "line 3"),
        (HEADER + "2024-05-12 00:00:00+00:00,5,1\n2024-05-12 00:00:01+00:00,5,-2\n", "line 3"),
        (HEADER + "yesterday,5,1\n", "line 2"),
        (HEADER + "2024-13-45 00:00:00+00:00,5,1\n", "TIMESTAMP"),
        (HEADER + "2024-05-12 00:00:00+00:00,5\n", "line 2"),
        (HEADER + "2024-05-12 00:00:00+00:00,5,1,9,9\n", "CSV"),
    ],
)
def test_malformed_input_is_a_user_error(tmp_path, content, needle):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(UserError, match=needle):
        subsample(path, minutes=1)


def test_window_beyond_the_end(tmp_path):
    path = write_csv(tmp_path / "t.csv", [(ts2024(0), 1, 1), (ts2024(60_000_000), 1, 1)])
    with pytest.raises(UserError, match="spans only 60.000 s"):
        subsample(path, start_offset_s=3600, minutes=1)


def test_missing_file_and_bad_settings(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        subsample(tmp_path / "nope.csv", minutes=1)
    path = write_csv(tmp_path / "t.csv", [(ts2024(0), 1, 1)])
    with pytest.raises(UserError, match="keep_every"):
        subsample(path, minutes=1, keep_every=0)
    with pytest.raises(UserError, match="no request kept"):
        subsample(path, minutes=1, phase=5)


# --- fetch --------------------------------------------------------------------------


def _entry(path: Path, url: str = "http://127.0.0.1:9/x", **extra) -> dict:
    return {"url": url, "file": path.name, **extra}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def small_trace(tmp_path) -> Path:
    (tmp_path / "src").mkdir()
    return write_csv(tmp_path / "src" / "small.csv", [(ts2024(us), 10, 2) for us in range(0, 5_000_000, 250_000)])


def test_fetch_from_mirror(tmp_path, small_trace, monkeypatch):
    mirror = tmp_path / "mirror"
    (mirror / "deep" / "er").mkdir(parents=True)
    (mirror / "deep" / "er" / small_trace.name).write_bytes(small_trace.read_bytes())
    monkeypatch.setenv(MIRROR_ENV, str(mirror))
    out = tmp_path / "out" / "trace.csv"
    fetch_trace(_entry(small_trace, sha256=_sha256(small_trace), size=small_trace.stat().st_size), out)
    assert out.read_bytes() == small_trace.read_bytes()


def test_fetch_real_trace_from_mirror(conv_trace, tmp_path, monkeypatch):
    monkeypatch.setenv(MIRROR_ENV, str(conv_trace.parent.parent))
    out = tmp_path / "conv.csv"
    fetch_trace(_entry(conv_trace, sha256=CONV_SHA256, size=CONV_SIZE), out)
    assert _sha256(out) == CONV_SHA256


def test_fetch_sha_mismatch_names_both(tmp_path, small_trace, monkeypatch):
    monkeypatch.setenv(MIRROR_ENV, str(small_trace.parent))
    out = tmp_path / "out" / "trace.csv"
    wrong = "0" * 64
    with pytest.raises(UserError) as err:
        fetch_trace(_entry(small_trace, sha256=wrong), out)
    assert wrong in str(err.value) and _sha256(small_trace) in str(err.value)
    assert list(out.parent.iterdir()) == []  # no output, no temp file


def test_fetch_download_by_url(tmp_path, small_trace, monkeypatch):
    """The download path, through urllib, without leaving the machine (a file:// URL)."""
    monkeypatch.delenv(MIRROR_ENV, raising=False)
    out = tmp_path / "out" / "trace.csv"
    fetch_trace(_entry(small_trace, url=small_trace.as_uri(), sha256=_sha256(small_trace)), out)
    assert out.read_bytes() == small_trace.read_bytes()


@pytest.mark.parametrize("mirror", [None, "empty"])
def test_fetch_offline_names_url_and_variable(tmp_path, monkeypatch, mirror):
    if mirror:
        (tmp_path / mirror).mkdir()
        monkeypatch.setenv(MIRROR_ENV, str(tmp_path / mirror))
    else:
        monkeypatch.delenv(MIRROR_ENV, raising=False)
    url = "http://127.0.0.1:9/x"
    out = tmp_path / "out" / "trace.csv"
    with pytest.raises(UserError) as err:
        fetch_trace({"url": url, "file": "AzureLLMInferenceTrace_conv.csv"}, out)
    assert url in str(err.value) and MIRROR_ENV in str(err.value)
    assert not out.parent.exists() or list(out.parent.iterdir()) == []
