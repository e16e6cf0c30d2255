"""`filledfirst trace stats`: whole-trace figures from one streamed pass."""

from __future__ import annotations

import json

import pytest

from filledfirst.errors import UserError
from filledfirst.trace.stats import summary_text, trace_stats
from filledfirst.trace.subsample import read_trace

from helpers.trace_files import HEADER, ts2024, write_csv


def test_real_trace_figures(conv_trace, tmp_path):
    out = tmp_path / "stats.json"
    s = trace_stats(conv_trace, out)
    assert json.loads(out.read_text()) == s.to_doc()
    # FACTS.md: 19,366 rows, one hour, median prompt 1,020, max 14,050, median output 129.
    assert (s.requests, s.bad_rows, s.out_of_order) == (19_366, 0, 0)
    assert (s.prompt_tokens.p50, s.prompt_tokens.max, s.output_tokens.p50) == (1020, 14_050, 129)
    assert sum(s.requests_per_minute) == 19_366 and len(s.requests_per_minute) == 59
    # The histogram percentiles are the ones polars computes on the whole column.
    df, _ = read_trace(conv_trace)
    for col, key in (("prompt", "prompt_tokens"), ("output", "output_tokens")):
        assert getattr(s, key).p90 == int(df[col].quantile(0.9, "nearest"))
        assert getattr(s, key).mean == pytest.approx(df[col].mean())
    assert s.span_s == (df["t_ns"].max() - df["t_ns"].min()) / 1e9
    text = summary_text(s)
    assert "median prompt about 1,020 tokens, p90 around 2,700" in text and "19,366 requests" in text


def test_minutes_are_counted_from_the_first_row(tmp_path):
    offsets = [0, 59_999_999, 60_000_000, 185_000_000]
    s = trace_stats(write_csv(tmp_path / "t.csv", [(ts2024(us), 10, 0) for us in offsets]))
    assert s.requests_per_minute == [2, 1, 0, 1]
    assert s.zero_output == 4 and s.span_s == 185.0
    assert s.mean_rate_per_s == pytest.approx(3 / 185.0)  # 4 arrivals: 3 gaps over the span


def test_one_row_has_no_rate(tmp_path):
    assert trace_stats(write_csv(tmp_path / "t.csv", [(ts2024(0), 10, 1)])).mean_rate_per_s is None


def test_bad_and_unsorted_rows_are_counted(tmp_path):
    rows = [(ts2024(0), 5, 1), (ts2024(2_000_000), 5, 1), (ts2024(1_000_000), 5, 1), ("noon", 5, 1),
            (ts2024(3), "x", 1)]
    s = trace_stats(write_csv(tmp_path / "t.csv", rows))
    assert (s.requests, s.bad_rows, s.out_of_order) == (3, 2, 1)
    assert "bad rows: 2" in summary_text(s)


@pytest.mark.parametrize("content, needle", [("", "empty"), (HEADER, "no usable rows"),
                                             ("a,b\n1,2\n", "missing column")])
def test_unusable_files(tmp_path, content, needle):
    path = tmp_path / "t.csv"
    path.write_text(content)
    with pytest.raises(UserError, match=needle):
        trace_stats(path)
    with pytest.raises(UserError, match="does not exist"):
        trace_stats(tmp_path / "nope.csv")


def test_cli_stats(conv_trace, tmp_path, capsys):
    from filledfirst.cli import main

    out = tmp_path / "s.json"
    assert main(["trace", "stats", str(conv_trace), "--out", str(out)]) == 0
    assert "median prompt about 1,020" in capsys.readouterr().out
    assert json.loads(out.read_text())["requests"] == 19_366
    assert main(["trace", "stats", str(tmp_path / "nope.csv")]) == 2
