"""Window extraction by bisecting byte offsets: it must give what the full scan gives."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filledfirst.errors import UserError
from filledfirst.trace.subsample import _subsample, subsample
from filledfirst.trace.timestamps import _regex_ns, fast_ns, parse_ns

from helpers.trace_files import HEADER, ts2024, write_csv

# Fields that differ by design: the bisect reads only the window, so it cannot count rows.
_BY_DESIGN = {"read", "trace_requests"}


def both(source, **spec) -> tuple[pl.DataFrame, dict]:
    """Run bisect and full scan; assert they agree; return the bisect's result."""
    fast, fast_info = _subsample(source, **spec)
    full, full_info = _subsample(source, scan="full", **spec)
    assert fast_info["read"] == "bisect" and full_info["read"] == "full"
    assert fast.equals(full)
    assert {k: v for k, v in fast_info.items() if k not in _BY_DESIGN} == {
        k: v for k, v in full_info.items() if k not in _BY_DESIGN
    }
    return fast, fast_info


@pytest.mark.parametrize(
    "spec",
    [
        dict(start_offset_s=0, minutes=10, keep_every=10),
        dict(start_offset_s=600, minutes=10, keep_every=10, phase=3),
        dict(start_offset_s=123.4, minutes=7.5, keep_every=4, phase=1, time_scale=0.25),
        dict(start_offset_s=3400, minutes=10),  # runs past the end
        dict(start="2023-11-16 18:40:00", minutes=1),
        dict(start="2023-11-16 18:15:46.6805900", minutes=0.5),  # exactly the first row
    ],
)
def test_bisect_equals_full_scan_on_real_trace(conv_trace, spec):
    df, info = both(conv_trace, **spec)
    assert df.height > 0


def _offsets_2024(n: int, seed: int) -> list[int]:
    import random

    rng = random.Random(seed)
    offsets = sorted(rng.randrange(0, 7_200_000_000) for _ in range(n))
    # Whole seconds (no fraction in the text) and ties, as the real 2024 files have.
    return sorted(offsets + [o - o % 1_000_000 for o in offsets[::7]] + offsets[::13])


def test_bisect_equals_full_scan_on_2024_format(tmp_path):
    rows = [(ts2024(us), 100 + i % 50, i % 9) for i, us in enumerate(_offsets_2024(5000, 3))]
    path = write_csv(tmp_path / "t.csv", rows)
    for spec in (
        dict(start_offset_s=0, minutes=10, keep_every=10),
        dict(start_offset_s=1800.5, minutes=3, keep_every=3, phase=2),
        dict(start="2024-05-12 01:00:00+00:00", minutes=10),
        dict(start="2024-05-12 01:00:00+01:00", minutes=1),  # a zone: 00:00 UTC, the first row
    ):
        both(path, **spec)


def test_window_bounds_are_half_open_on_ties(tmp_path):
    # Several rows on exactly the start and the end instant.
    offsets = [0, 0, 59_999_999, 60_000_000, 60_000_000, 120_000_000, 120_000_000, 130_000_000]
    path = write_csv(tmp_path / "t.csv", [(ts2024(us), i + 1, 1) for i, us in enumerate(offsets)])
    df, info = both(path, start_offset_s=60, minutes=1)
    assert df["prompt_tokens"].to_list() == [4, 5]
    assert info["window"].requests == 2


_sorted_offsets = st.lists(st.integers(0, 600_000_000), min_size=1, max_size=120).map(sorted)


@settings(max_examples=60, deadline=None)
@given(_sorted_offsets, st.integers(0, 700_000), st.integers(1, 400_000), st.integers(1, 4))
def test_property_bisect_is_exact(offsets, start_ms, length_ms, keep_every):
    with tempfile.TemporaryDirectory() as tmp:
        path = write_csv(Path(tmp) / "t.csv", [(ts2024(us), i + 1, 1) for i, us in enumerate(offsets)])
        start_s, minutes = start_ms / 1000, length_ms / 60_000
        lo = offsets[0] + start_ms * 1000
        hi = lo + round(minutes * 60 * 1e6)
        expected = [i + 1 for i, us in enumerate(offsets) if lo <= us < hi][::keep_every]
        if start_ms * 1000 > offsets[-1] - offsets[0]:
            with pytest.raises(UserError, match="spans only"):
                _subsample(path, start_offset_s=start_s, minutes=minutes, keep_every=keep_every)
            return
        if not expected:
            with pytest.raises(UserError, match="no request kept"):
                _subsample(path, start_offset_s=start_s, minutes=minutes, keep_every=keep_every)
            return
        df, _ = both(path, start_offset_s=start_s, minutes=minutes, keep_every=keep_every)
        assert df["prompt_tokens"].to_list() == expected


_stamp = st.tuples(
    st.integers(1_500_000_000, 1_900_000_000),  # whole seconds since 1970
    st.integers(0, 999_999_999),
    st.sampled_from(["2023", "2024", "2024whole", "zone"]),
    st.integers(-12 * 60, 14 * 60).map(lambda m: m - m % 15),
)


def _render(seconds: int, nanos: int, form: str, zone_min: int) -> tuple[str, int]:
    from datetime import datetime, timedelta, timezone

    if form == "2023":
        nanos -= nanos % 100  # seven digits
        text = f"{datetime.fromtimestamp(seconds, timezone.utc):%Y-%m-%d %H:%M:%S}.{nanos // 100:07d}"
        return text, seconds * 10**9 + nanos
    if form == "2024whole":
        return f"{datetime.fromtimestamp(seconds, timezone.utc):%Y-%m-%d %H:%M:%S}+00:00", seconds * 10**9
    nanos -= nanos % 1000
    zone = timezone(timedelta(minutes=zone_min if form == "zone" else 0))
    local = datetime.fromtimestamp(seconds, zone)
    text = f"{local:%Y-%m-%d %H:%M:%S}.{nanos // 1000:06d}{local:%z}"
    return text[:-2] + ":" + text[-2:], seconds * 10**9 + nanos


@settings(max_examples=200, deadline=None)
@given(st.lists(_stamp, min_size=1, max_size=20))
def test_property_fast_parser_equals_reference(stamps):
    texts, expected = zip(*(_render(*s) for s in stamps))
    col = pl.Series(list(texts))
    assert pl.select(fast_ns(pl.lit(col))).to_series().to_list() == list(expected)
    assert _regex_ns(col).to_list() == list(expected)
    assert parse_ns(col).to_list() == list(expected)


# --- falling back, and bad rows found by the bisect path ----------------------------


def test_unsorted_file_falls_back_to_full_scan_with_a_warning(tmp_path, caplog):
    # Row order broken inside the window: the local check sees it.
    offsets = [0, 10_000_000, 30_000_000, 20_000_000, 40_000_000, 300_000_000]
    path = write_csv(tmp_path / "t.csv", [(ts2024(us), i + 1, 1) for i, us in enumerate(offsets)])
    with caplog.at_level(logging.WARNING), pytest.raises(UserError, match="earlier than a row above it.*line 5"):
        subsample(path, minutes=1)
    assert "cannot bisect" in caplog.text and "reading the whole file" in caplog.text
    df, info = _subsample(path, minutes=1, skip_bad=True)
    assert info["read"] == "full" and info["skipped_by_reason"] == {"out_of_order": 1}
    assert df["prompt_tokens"].to_list() == [1, 2, 3, 5]


def test_bad_row_in_window_names_its_line(tmp_path):
    rows = [(ts2024(us), 5, 1) for us in range(0, 600_000_000, 100_000)]  # 6,000 rows
    rows[4321] = (rows[4321][0], "lots", 1)
    rows[4400] = (rows[4400][0], 0, 1)
    path = write_csv(tmp_path / "t.csv", rows)
    with pytest.raises(UserError) as err:
        subsample(path, start_offset_s=400, minutes=1)
    msg = str(err.value)
    assert "line 4323 ('lots')" in msg and "line 4402 ('0')" in msg and "--skip-bad" in msg
    df, info = _subsample(path, start_offset_s=400, minutes=1, skip_bad=True)
    assert info["read"] == "bisect" and info["skipped"] == 2 and df.height == 598


# --- malformed files ----------------------------------------------------------------

_GOOD = [f"{ts2024(us)},{i + 1},2" for i, us in enumerate(range(0, 10_000_000, 1_000_000))]


@pytest.mark.parametrize("read", ["auto", "full"])
@pytest.mark.parametrize(
    "name, content, expect",
    [
        ("crlf", (HEADER + "".join(r + "\n" for r in _GOOD)).replace("\n", "\r\n"), 10),
        ("bom", "\ufeff" + HEADER + "".join(r + "\n" for r in _GOOD), 10),
        ("no final newline", HEADER + "\n".join(_GOOD), 10),
        ("blank lines at the end", HEADER + "".join(r + "\n" for r in _GOOD) + "\n\n", 10),
        ("truncated last line", HEADER + "".join(r + "\n" for r in _GOOD) + "2024-05-12 00:00:1", "line 12"),
        ("truncated after a comma", HEADER + "".join(r + "\n" for r in _GOOD) + ts2024(11_000_000) + ",5", "line 12"),
        ("text token count", HEADER + "".join(r + "\n" for r in _GOOD[:3]) + f"{ts2024(3_500_000)},12k,4\n"
         + "".join(r + "\n" for r in _GOOD[4:]), "line 5 \\('12k'\\)"),
        ("empty", "", "empty"),
        ("header only", HEADER, "no rows"),
        ("header only, no newline", HEADER.strip(), "no rows"),
    ],
)
def test_malformed_files(tmp_path, name, content, expect, read):
    path = tmp_path / "t.csv"
    path.write_bytes(content.encode())
    if isinstance(expect, int):
        df, _ = _subsample(path, minutes=1, scan=read)
        assert df.height == expect and df["prompt_tokens"].to_list() == list(range(1, 11))
        return
    with pytest.raises(UserError, match=expect):
        _subsample(path, minutes=1, scan=read)
    if "line" in expect:  # a bad row: --skip-bad drops it and counts it
        df, info = _subsample(path, minutes=1, scan=read, skip_bad=True)
        assert info["skipped"] == 1 and df.height == (9 if "token" in name else 10)


# --- the command line ---------------------------------------------------------------


def test_cli_start_and_skip_bad(tmp_path, capsys):
    from filledfirst.cli import main

    rows = [(ts2024(us), 7, 2) for us in range(0, 120_000_000, 1_000_000)]
    rows.insert(101, (ts2024(100_500_000), -1, 2))  # outside the first window, inside the second
    src = write_csv(tmp_path / "t.csv", rows)
    out = tmp_path / "s.parquet"
    argv = ["trace", "subsample", str(src), "--start", "2024-05-12 00:01:00+00:00", "--minutes", "0.5",
            "--out", str(out)]
    assert main(argv) == 0
    assert pl.read_parquet(out).height == 30
    with pytest.raises(SystemExit):  # argparse: the two starts exclude each other
        main(argv + ["--start-offset", "3"])
    full = ["trace", "subsample", str(src), "--start-offset", "100", "--minutes", "1", "--out", str(out)]
    assert main(full) == 2
    assert "ContextTokens" in capsys.readouterr().err
    assert main(full + ["--skip-bad"]) == 0
    assert pl.read_parquet(out).height == 20
    with pytest.raises(UserError, match="before the first request"):
        subsample(src, start="2024-05-11 23:59:59+00:00", minutes=1)
    with pytest.raises(UserError, match="not a timestamp"):
        subsample(src, start="noon", minutes=1)


def test_bad_first_row_with_skip_bad_gives_the_same_origin(tmp_path):
    # The full scan drops the bad first row and counts from the second; so must the bisect
    # path (it falls back, since its origin would be the bad row).
    rows = [(ts2024(0), 0, 1)] + [(ts2024(us), 5, 1) for us in range(500_000, 120_000_000, 1_000_000)]
    path = write_csv(tmp_path / "t.csv", rows)
    fast, info = _subsample(path, start_offset_s=30, minutes=0.5, skip_bad=True)
    full, _ = _subsample(path, start_offset_s=30, minutes=0.5, skip_bad=True, scan="full")
    assert fast.equals(full) and info["read"] == "full" and fast["t_offset_s"][0] == 0.0
