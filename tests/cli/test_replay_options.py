"""`filledfirst replay`'s numbers have the config schema's bounds (one definition): a value
out of bounds is a usage error naming the option (exit 2), before anything is asked of
the endpoint or written."""

from __future__ import annotations

import pytest

from filledfirst import cli

BASE = ["replay", "--url", "http://127.0.0.1:1", "--schedule", "s.parquet", "--out", "out", "--model", "m",
        "--token-ids", "10", "20", "--no-progress"]

BAD = [
    ("--closed", "-1"), ("--closed", "0"), ("--closed", "1.5"),
    ("--scrape-interval", "0"), ("--scrape-interval", "-0.25"), ("--scrape-interval", "nan"),
    ("--request-timeout", "0"), ("--request-timeout", "-5"), ("--request-timeout", "inf"),
    ("--connect-timeout", "0"), ("--first-token-timeout", "-1"), ("--drain-timeout", "0"),
    ("--workers", "0"), ("--seed", "x"), ("--max-num-seqs", "0"), ("--max-num-batched-tokens", "2.5"),
]


@pytest.mark.parametrize("option, value", BAD)
def test_an_out_of_bounds_number_is_a_usage_error_naming_the_option(option, value, capsys, tmp_path,
                                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        cli.main([*BASE, option, value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert f"argument {option}" in err, err
    assert not list(tmp_path.iterdir())


def test_token_ids_have_the_schemas_bounds(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main([*BASE[:-4], "--token-ids", "-1", "20", "--no-progress"])
    assert exit_.value.code == 2 and "argument --token-ids" in capsys.readouterr().err


def test_in_bounds_numbers_pass():
    args = cli.build_parser().parse_args([*BASE, "--closed", "3", "--scrape-interval", "0.1", "--request-timeout",
                                          "2", "--drain-timeout", "1", "--connect-timeout", "0.5", "--seed", "-3"])
    assert (args.closed, args.scrape_interval, args.request_timeout, args.seed) == (3, 0.1, 2.0, -3)
    limits = cli.build_parser().parse_args([*BASE, "--max-num-seqs", "8", "--max-num-batched-tokens", "2048"])
    assert (limits.max_num_seqs, limits.max_num_batched_tokens) == (8, 2048)
