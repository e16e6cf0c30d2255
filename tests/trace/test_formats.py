"""Trace formats other than Azure's: the Mooncake JSONL (real file) and a user's own CSV or
JSONL by a column mapping; prefix blocks, the length scale and the ideal cache's hits."""

from __future__ import annotations

import json
import random
from pathlib import Path

import polars as pl
import pytest

from filledfirst.contracts.stats import ScheduleStats
from filledfirst.errors import UserError
from filledfirst.study import TraceColumns
from filledfirst.trace.formats import Format
from filledfirst.trace.prefix import ideal_cached_tokens
from filledfirst.trace.stats import trace_stats
from filledfirst.trace.subsample import stretches_to_parquet, subsample, subsample_to_parquet

MOONCAKE = Format.of("mooncake")


@pytest.fixture(scope="module")
def mooncake_rows(mooncake_trace) -> list[dict]:
    return [json.loads(line) for line in mooncake_trace.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("start_offset_s, minutes, keep_every, phase",
                         [(0, 10, 1, 0), (600, 5, 7, 3), (1800.5, 2, 3, 1)])
def test_mooncake_window_and_every_k_give_the_exact_requests(mooncake_trace, mooncake_rows, start_offset_s, minutes,
                                                              keep_every, phase):
    ms = [r["timestamp"] for r in mooncake_rows]
    start = ms[0] + start_offset_s * 1000
    window = [i for i, t in enumerate(ms) if start <= t < start + minutes * 60_000]
    kept = window[phase::keep_every]
    df = subsample(mooncake_trace, fmt=MOONCAKE, start_offset_s=start_offset_s, minutes=minutes,
                   keep_every=keep_every, phase=phase)
    assert df.height == len(kept) > 0
    assert df["t_offset_s"].to_list() == pytest.approx([(ms[i] - start) / 1000 for i in kept], abs=1e-9)
    assert df["prompt_tokens"].to_list() == [mooncake_rows[i]["input_length"] for i in kept]
    assert df["output_tokens"].to_list() == [max(1, mooncake_rows[i]["output_length"]) for i in kept]
    assert df["prefix_blocks"].to_list() == [mooncake_rows[i]["hash_ids"] for i in kept]
    assert set(df["block_tokens"].to_list()) == {512}


def test_the_whole_mooncake_file_is_one_hour_of_12031_requests(mooncake_trace):
    stats = trace_stats(mooncake_trace, fmt=MOONCAKE)
    assert (stats.requests, stats.bad_rows, stats.out_of_order) == (12_031, 0, 0)
    assert 3500 < stats.span_s <= 3600


# The hand count, on five requests of the real file (rows 0, 1, 10, 134, 137), 512-token blocks:
# row 0 (6,758 tokens) is first: nothing cached, its 13 whole blocks kept;
# row 1 shares only id 0 with it: 1 block;  row 10 likewise: 1 block;
# row 134 shares 26 ids with row 10, whose 13,544 tokens make 26 whole blocks: 26 blocks;
# row 137 shares 14 ids with row 1, whose 7,322 tokens make 14 whole blocks: 14 blocks.
EXCERPT_ROWS = (0, 1, 10, 134, 137)
HAND_COUNT_BLOCKS = [0, 1, 1, 26, 14]


def test_the_ideal_hits_of_an_excerpt_match_a_hand_count(mooncake_rows, tmp_path):
    excerpt = tmp_path / "excerpt.jsonl"
    excerpt.write_text("".join(json.dumps(mooncake_rows[i] | {"timestamp": k}) + "\n"
                               for k, i in enumerate(EXCERPT_ROWS)))
    out = tmp_path / "excerpt.parquet"
    stats = subsample_to_parquet(excerpt, out, fmt=MOONCAKE, minutes=1)
    df = pl.read_parquet(out)
    assert df["ideal_cached_tokens"].to_list() == [512 * b for b in HAND_COUNT_BLOCKS]
    prompts = sum(mooncake_rows[i]["input_length"] for i in EXCERPT_ROWS)
    assert stats.ideal_hit_share == pytest.approx(512 * sum(HAND_COUNT_BLOCKS) / prompts)
    assert (stats.format, stats.block_tokens, stats.trace_block_tokens) == ("mooncake", 512, 512)

    # A quarter of the sizes: 128-token blocks, the same blocks hit, a quarter of the tokens.
    quarter = tmp_path / "quarter.parquet"
    q = subsample_to_parquet(excerpt, quarter, fmt=MOONCAKE, minutes=1, length_scale=0.25)
    dq = pl.read_parquet(quarter)
    assert dq["ideal_cached_tokens"].to_list() == [128 * b for b in HAND_COUNT_BLOCKS]
    assert dq["prompt_tokens"].to_list() == [round(mooncake_rows[i]["input_length"] / 4) for i in EXCERPT_ROWS]
    assert (q.block_tokens, q.length_scale, q.trace_prompt_tokens.max) == (128, 0.25, 49_948)
    with pytest.raises(UserError, match="whole number"):
        subsample(excerpt, fmt=MOONCAKE, minutes=1, length_scale=0.3)


def test_ideal_hits_follow_the_chain_not_the_id():
    # the same id after a different first block is a different block; a partial block is
    # never cached; a prompt fully cached still computes its last token
    assert ideal_cached_tokens([[1, 2], [3, 2], [1, 2]], [8, 8, 8], 4) == [0, 0, 4]
    assert ideal_cached_tokens([[1, 2], [1, 2, 5]], [6, 12], 4) == [0, 4]
    assert ideal_cached_tokens([[7, 8], [7, 8], [7, 8, 9]], [8, 8, 9], 4) == [0, 4, 8]


def _generic(tmp_path: Path, kind: str) -> tuple[Path, TraceColumns, list[tuple[int, int, int, list[int]]]]:
    """A user's own trace: arrival times in ms (JSONL) or epoch seconds with a fraction (CSV)."""
    rng = random.Random(5)
    t, rows = 0, []
    for _ in range(600):
        t += rng.randrange(0, 900)
        blocks = [rng.randrange(3) for _ in range(rng.randrange(4))]
        rows.append((t, rng.randrange(1, 300), rng.randrange(0, 50), blocks))
    if kind == "jsonl":
        path = tmp_path / "mine.jsonl"
        path.write_text("".join(json.dumps({"arrived_ms": t, "in": p, "out": o, "blocks": b}) + "\n"
                                for t, p, o, b in rows))
        cols = TraceColumns(time="arrived_ms", time_unit="ms", prompt="in", output="out", prefix_blocks="blocks",
                            block_tokens=16)
    else:
        path = tmp_path / "mine.csv"
        epoch_ms = 1_700_000_000_000
        path.write_text("when,input tokens,output tokens,blocks\n" + "".join(
            f"{(epoch_ms + t) // 1000}.{(epoch_ms + t) % 1000:03d},{p},{o},{' '.join(map(str, b))}\n"
            for t, p, o, b in rows))
        cols = TraceColumns(time="when", time_unit="s", prompt="input tokens", output="output tokens",
                            prefix_blocks="blocks", block_tokens=16)
    return path, cols, rows


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_a_trace_of_your_own_gives_the_exact_window_and_every_k(tmp_path, kind):
    path, cols, rows = _generic(tmp_path, kind)
    start_ms, minutes, k, phase = 30_000, 2, 4, 1
    window = [i for i, r in enumerate(rows) if start_ms <= r[0] - rows[0][0] < start_ms + minutes * 60_000]
    kept = window[phase::k]
    df = subsample(path, fmt=Format.of(cols), start_offset_s=start_ms / 1000, minutes=minutes, keep_every=k,
                   phase=phase, time_scale=0.5)
    assert df.height == len(kept) > 10
    assert df["t_offset_s"].to_list() == pytest.approx(
        [(rows[i][0] - rows[0][0] - start_ms) / 1000 * 0.5 for i in kept], abs=1e-9)
    assert df["prompt_tokens"].to_list() == [rows[i][1] for i in kept]
    assert df["prefix_blocks"].to_list() == [rows[i][3][: -(-rows[i][1] // 16)] for i in kept]


def test_the_epoch_csv_is_bisected_and_agrees_with_a_full_read(tmp_path):
    path, cols, _ = _generic(tmp_path, "csv")
    spec = dict(fmt=Format.of(cols), start_offset_s=60, minutes=1, keep_every=2)
    bisected = tmp_path / "b.parquet"
    stats = subsample_to_parquet(path, bisected, **spec)
    assert stats.read == "bisect"
    assert pl.read_parquet(bisected).equals(subsample(path, scan="full", **spec))


def test_a_bad_jsonl_line_is_named_by_its_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
                    '\n'
                    'not json at all\n'
                    '{"timestamp": 10, "input_length": 0, "output_length": 1, "hash_ids": [1]}\n'
                    '{"timestamp": 20, "input_length": 5, "output_length": 1, "hash_ids": [1, "x"]}\n')
    with pytest.raises(UserError) as err:
        subsample(path, fmt=MOONCAKE, minutes=1)
    text = str(err.value)
    assert "line 3 ('not json at all')" in text and "unreadable timestamp" in text
    assert "a input_length that is not a whole number >= 1, e.g. line 4" in text
    assert "hash_ids that is not a list of whole numbers, e.g. line 5" in text
    df = subsample(path, fmt=MOONCAKE, minutes=1, skip_bad=True)
    assert df.height == 1


def test_a_probe_cut_from_a_prefix_trace_keeps_its_blocks_and_counts_its_own_hits(mooncake_trace, tmp_path):
    out = tmp_path / "probe.parquet"
    stats = stretches_to_parquet(mooncake_trace, out, starts_s=(0.0, 600.0), stretch_s=60.0, minutes=20,
                                 time_scale=1.0, fmt=MOONCAKE, length_scale=0.25)
    df = pl.read_parquet(out)
    assert stats.requests == df.height > 0 and stats.block_tokens == 128
    # the ideal is the probe's own: recomputed in its arrival order
    assert df["ideal_cached_tokens"].to_list() == ideal_cached_tokens(
        df["prefix_blocks"].to_list(), df["prompt_tokens"].to_list(), 128)
    assert 0 < stats.ideal_hit_share < 1
    assert ScheduleStats.load(str(out) + ".stats.json").ideal_hit_share == stats.ideal_hit_share


def test_a_column_mapping_needs_block_tokens_with_prefix_blocks():
    with pytest.raises(UserError, match="needs block_tokens"):
        Format.of(TraceColumns(time="t", prompt="p", output="o", prefix_blocks="b"))
