"""Prefix caching on the real vLLM CPU engine, through the whole pipeline: traces read by
a column mapping of their own, prompts built from their prefix blocks, the cached tokens
each answer reports and the server's counters, and the eviction label."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from filledfirst.analysis.diagnosis.labels import Label

from conftest import REPO, snakemake_argv

pytestmark = pytest.mark.engine

BLOCK = 128  # the CPU engine's block, and the designed traces' (tests/configs/prefix.yaml)
# Each answer of 120 tokens takes its request past its last block (20 + 120 > 128): the
# running requests grow into a full KV, which preempts, whatever the speed.
CONVERSATIONS, TURNS, BLOCKS_PER_TURN, TAIL, OUTPUT = 24, 6, 2, 20, 120


def _jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_traces(mirror) -> None:
    mirror.mkdir()
    # three shared blocks, then each its own partial block
    _jsonl(mirror / "prefix-pair.jsonl", [
        {"t_ms": 0, "prompt": 3 * BLOCK + 50, "output": 4, "blocks": [1, 2, 3, 7]},
        {"t_ms": 2000, "prompt": 3 * BLOCK + 50, "output": 4, "blocks": [1, 2, 3, 9]},
    ])
    rows = []
    for turn in range(TURNS):
        for c in range(CONVERSATIONS):
            blocks = [1000 * (c + 1) + b for b in range(BLOCKS_PER_TURN * (turn + 1) + 1)]
            rows.append({"t_ms": 10 * len(rows), "prompt": BLOCK * BLOCKS_PER_TURN * (turn + 1) + TAIL,
                         "output": OUTPUT, "blocks": blocks})
    _jsonl(mirror / "prefix-conversations.jsonl", rows)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("prefix")
    write_traces(root / "mirror")  # the traces are the test's own: no other mirror needed
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "FILLEDFIRST_TRACE_MIRROR": str(root / "mirror"), "HF_HUB_OFFLINE": "1"}
    (root / "work").mkdir()
    cfg = REPO / "tests" / "configs" / "prefix.yaml"
    proc = subprocess.run(snakemake_argv(root / "work", cfg, "all"), env=env, capture_output=True, text=True,
                          timeout=2400)
    assert proc.returncode == 0, proc.stderr[-6000:]
    con = duckdb.connect(str(root / "work" / "results" / "filledfirst.duckdb"), read_only=True)
    yield root / "work", con
    con.close()


def _by_experiment(con, sql: str, experiment: str):
    return con.execute(sql + " WHERE experiment = ?", [experiment]).fetchall()


def test_the_second_of_two_requests_sharing_three_blocks_is_served_them_from_the_cache(study):
    _, con = study
    rows = _by_experiment(con, """SELECT request_id, requests.status, prompt_tokens_received, cached_tokens,
                                         ideal_cached_tokens FROM requests JOIN runs USING (run_id)""", "pair")
    assert sorted(rows) == [(0, "ok", 434, 0, 0), (1, "ok", 434, 3 * BLOCK, 3 * BLOCK)]
    from filledfirst.analysis.prefix_cache import counts

    server = {r["run_id"]: r for r in counts(con).to_dicts()}
    (run_id,), = _by_experiment(con, "SELECT run_id FROM runs", "pair")
    # the server's own counter agrees with the answers
    assert server[run_id]["server_hit_tokens"] == 3 * BLOCK
    assert server[run_id]["server_query_tokens"] == 2 * 434


def test_a_roomy_cache_serves_what_the_trace_offered(study):
    _, con = study
    (ideal, measured, efficiency, label), = _by_experiment(
        con, "SELECT ideal_hit_share, measured_hit_share, cache_efficiency, label FROM diagnosis", "cache_roomy")
    assert ideal > 0.5  # the design: about 70 % of the prompt tokens repeat a turn before
    assert efficiency > 0.9, (ideal, measured)
    assert label != Label.PREFIX_EVICTION


def test_full_kv_evicts_the_shared_prefixes_and_is_named_for_it(study):
    _, con = study
    got = {e: (label, clue) for e, label, clue in con.execute("SELECT experiment, label, clue FROM diagnosis")
           .fetchall()}
    assert got["cache_evicted"][0] == Label.PREFIX_EVICTION, got["cache_evicted"]
    # the control has the same KV pressure and no cache: not eviction
    assert got["cache_off"][0] != Label.PREFIX_EVICTION, got["cache_off"]
    (efficiency,), = _by_experiment(con, "SELECT cache_efficiency FROM diagnosis", "cache_evicted")
    (off_hits,), = _by_experiment(con, "SELECT measured_hit_share FROM diagnosis", "cache_off")
    assert efficiency < 0.5 and off_hits == 0


def test_the_report_draws_the_hit_rate_charts_offline(study, tmp_path):
    workdir, _ = study
    from helpers.chromium import CHROMIUM, ChartDivs, chromium_run

    html = workdir / "reports" / "report.html"
    text = html.read_text()
    assert "Prefix cache: the reuse offered against the reuse delivered" in text
    # the part's table: each run's ideal against served share, from the same counts
    from filledfirst.analysis.numbers import share
    from filledfirst.analysis.prefix_cache import counts

    _, con = study
    row = re.search(r"<th[^>]*>prompt tokens from the cache \(ideal / served\)</th>(.*?)</tr>", text, re.S)
    assert row, "no prefix_hits row in the part's table"
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1))
    shares = {r["run_id"]: r for r in counts(con).to_dicts()}
    order = [run_id for run_id, in con.execute(
        "SELECT r.run_id FROM runs r JOIN diagnosis d USING (run_id) WHERE r.experiment IN "
        "('pair', 'cache_roomy', 'cache_evicted', 'cache_off')").fetchall()]
    assert sorted(cells) == sorted(f"{share(shares[i]['ideal_share'])} / {share(shares[i]['answers_share'])}"
                                   for i in order)
    (off,), = _by_experiment(con, "SELECT run_id FROM runs", "cache_off")
    assert f"{share(shares[off]['ideal_share'])} / 0 %" in cells
    assert Label.PREFIX_EVICTION in text
    if not CHROMIUM.exists():
        pytest.skip("no headless Chromium here")
    run = chromium_run("--dump-dom", html.as_uri(), profile=tmp_path / "chromium")
    charts = ChartDivs()
    charts.feed(run.stdout)
    assert charts.charts and all(charts.charts.values()), charts.charts
    assert [line for line in run.stderr.splitlines() if ":CONSOLE" in line] == []
