"""`filledfirst replay --schedule` checks the schedule before anything starts: a column of
the wrong type, an offset that is not a finite number >= 0, a token count below 1, a
missing value or a repeated request_id is an error naming the column and the row (exit 2,
no run folder, nothing left behind), and no request is sent."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from filledfirst import cli
from filledfirst.errors import UserError
from filledfirst.schedule import load_schedule

from helpers.stream_double import StreamDouble


def good(n=4) -> dict:
    return {"request_id": list(range(n)), "t_offset_s": [0.01 * i for i in range(n)],
            "prompt_tokens": [8] * n, "output_tokens": [2] * n, "role": ["probe"] * n}


def changed(column, row, value) -> dict:
    cols = good()
    cols[column] = list(cols[column])
    cols[column][row] = value
    return cols


CASES = {
    "string offset": ({**good(), "t_offset_s": ["0", "0.01", "soon", "0.03"]}, "column t_offset_s", "row 2"),
    "NaN offset": (changed("t_offset_s", 1, math.nan), "column t_offset_s", "row 1"),
    "negative offset": (changed("t_offset_s", 3, -1.0), "column t_offset_s", "row 3"),
    "infinite offset": (changed("t_offset_s", 0, math.inf), "column t_offset_s", "row 0"),
    "missing offset": (changed("t_offset_s", 2, None), "column t_offset_s", "row 2"),
    "duplicate id": (changed("request_id", 3, 1), "column request_id", "row 3"),
    "float id": (changed("request_id", 0, 0.5), "column request_id", "row 0"),
    "zero output": (changed("output_tokens", 1, 0), "column output_tokens", "row 1"),
    "negative prompt": (changed("prompt_tokens", 2, -5), "column prompt_tokens", "row 2"),
    "missing role": (changed("role", 0, None), "column role", "row 0"),
    "no role column": ({k: v for k, v in good().items() if k != "role"}, "column role", "missing"),
}


def write(path, cols) -> None:
    pq.write_table(pa.table(cols), path)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_schedule_is_refused_before_anything_starts(case, tmp_path, capsys):
    cols, column, row = CASES[case]
    write(tmp_path / "s.parquet", cols)
    double = StreamDouble()
    with double.serving_in_thread() as base:
        code = cli.main(["replay", "--url", base, "--schedule", str(tmp_path / "s.parquet"),
                         "--out", str(tmp_path / "out"), "--model", "double", "--token-ids", "10", "20",
                         "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    line = [x for x in err.splitlines() if x.startswith("filledfirst: error:")]
    assert len(line) == 1 and column in line[0] and row in line[0], err
    assert double.requests == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.parquet"]  # no run folder, no .partial-*


def test_a_good_schedule_loads_in_time_order_of_rows(tmp_path):
    cols = good()
    cols["t_offset_s"] = [0, 1, 2, 3]  # whole seconds written as integers are offsets too
    write(tmp_path / "s.parquet", cols)
    sched = load_schedule(tmp_path / "s.parquet")
    assert [r.request_id for r in sched] == [0, 1, 2, 3]
    assert all(type(r.t_offset_s) is float for r in sched)


def test_a_file_that_is_not_parquet_is_a_user_error(tmp_path):
    (tmp_path / "s.parquet").write_text("request_id,t_offset_s\n")
    with pytest.raises(UserError, match="s.parquet"):
        load_schedule(tmp_path / "s.parquet")
