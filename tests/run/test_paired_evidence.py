"""A paired check block's evidence read from its scrapes (filledfirst.run.paired), on
vLLM /metrics pages written here: no server needed, the thing under test is our reading."""

from __future__ import annotations

import dataclasses

import pyarrow.parquet as pq
import pytest

from filledfirst.contracts.records import SAMPLE_SCHEMA, to_table
from filledfirst.contracts.search import Knob
from filledfirst.metrics import parse_metrics
from filledfirst.run import folder
from filledfirst.run.paired import block_evidence


def page(running: int, waiting: int, kv: float, engine: int = 0, blocks: int = 100, cache: bool = True) -> str:
    e = f'engine="{engine}",model_name="m"'
    text = (f"vllm:num_requests_running{{{e}}} {running}\nvllm:num_requests_waiting{{{e}}} {waiting}\n"
            f"vllm:kv_cache_usage_perc{{{e}}} {kv}\n")
    return text + (f'vllm:cache_config_info{{block_size="16",{e},num_gpu_blocks="{blocks}"}} 1.0\n' if cache else "")


def write(tmp_path, pages: list[str]):
    samples = [s for t, text in enumerate(pages) for s in parse_metrics(text, float(t))]
    pq.write_table(to_table(samples, SAMPLE_SCHEMA), tmp_path / folder.SAMPLES)
    return tmp_path


def test_the_shares_count_busy_scrapes_beyond_the_old_limit_and_with_a_queue(tmp_path):
    # idle, then 4 running (beyond a cap of 2), 2 running with 2 waiting, 3 running; KV of
    # 1,600 tokens: 50 % is 800 tokens held, beyond a budget of 640
    run = write(tmp_path, [page(0, 0, 0.0), page(4, 0, 0.5), page(2, 2, 0.3), page(3, 0, 0.2)])
    assert block_evidence(run, Knob.SEQS, 2) == (pytest.approx(2 / 3), pytest.approx(1 / 3))
    assert block_evidence(run, Knob.KV, 640) == (pytest.approx(1 / 3), pytest.approx(1 / 3))


def test_engines_are_judged_each_against_the_limit_and_queues_summed(tmp_path):
    # two engines of cap 2: 2 + 2 running is no engine beyond it; each engine's series
    # carries both engines' 200 blocks, so half-full is 800 tokens an engine, not 1,600
    run = write(tmp_path, [page(2, 0, 0.5, 0, 200) + page(2, 1, 0.5, 1, 200)])
    assert block_evidence(run, Knob.SEQS, 2) == (0.0, 1.0)
    assert block_evidence(run, Knob.KV, 1000) == (0.0, 1.0)
    assert block_evidence(run, Knob.KV, 700) == (1.0, 1.0)


def test_a_kv_budget_without_the_cache_settings_is_not_known(tmp_path):
    run = write(tmp_path, [page(2, 0, 0.9, cache=False)])
    assert block_evidence(run, Knob.KV, 10) == (None, 0.0)


def test_no_busy_scrape_is_no_evidence(tmp_path):
    assert block_evidence(write(tmp_path, [page(0, 0, 0.0)]), Knob.SEQS, 2) == (None, None)


def test_the_loops_fill_what_the_larger_setting_holds():
    from filledfirst.config import load_study
    from filledfirst.contracts.search import Intervention
    from filledfirst.frontier.plan import frontier_plan

    from conftest import REPO

    plan = frontier_plan(load_study([REPO / "config" / "cpu.yaml"]), "kv")
    # 160 blocks of 128 tokens hold 14 requests of 1,400 tokens, 640 blocks 58: below the cap of 64
    assert plan.paired_concurrency("reduced_seqs_x4") == plan.kv_fit("reduced") < 64
    assert plan.kv_fit("reduced") < plan.paired_concurrency("reduced_kv_x4") == plan.kv_fit("reduced_kv_x4") <= 64
    capless = Intervention(parent="reduced", knob=Knob.SEQS, before=1, after=2, changes={})
    assert dataclasses.replace(plan, settings={"reduced": {}, "x": {}},
                               interventions={"x": capless}).paired_concurrency("x") is None


@pytest.mark.parametrize("n, requests", [(58, 116), (16, 80), (14, 70), (8, 64), (64, 128), (1, 51)])
def test_a_paired_block_is_whole_rounds_with_at_least_50_counted_after_the_first(n, requests):
    from filledfirst.frontier.plan import PAIRED_MIN_COUNTED, paired_requests

    got = paired_requests(n)
    assert got == requests and got % n == 0 and got - n >= PAIRED_MIN_COUNTED > got - 2 * n
