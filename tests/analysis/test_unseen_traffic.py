"""What filled first on traffic nobody designed: two limits filling in one run, and a run
whose requests queued in short bursts (synthetic databases reproducing what unseen
replays showed)."""

from __future__ import annotations

import pytest

from filledfirst.study import DiagnosisRules

from helpers.synthetic_db import (
    RUNNING,
    every,
    kv_pressure_run,
    queue,
    reference_run,
    request,
    run_of,
    series,
    timed,
)

# 200 arrivals over 19.9 s: the loaded window is 2.0 to 19.9 s (17.9 s)
WINDOW = (2.0, 19.9)


def two_limits(cap_from_s, kv_from_s, kv_pct=96.0, preempt_every_s=0.5, waiting=30):
    reqs = [timed(r) for r in queue(every(0.1, 200), 1.2, 8)]  # a queue that grows: TTFT mostly vLLM's queue
    full = min(cap_from_s, kv_from_s)
    samples = series(21, lambda t: 64 if t >= cap_from_s else 40, lambda t: waiting if t >= full else 0,
                     lambda t: kv_pct if t >= kv_from_s else 60)
    samples += [(t, "vllm:num_preemptions_total", max(0.0, (t - kv_from_s) // preempt_every_s))
                for t, m, _ in samples if m == RUNNING]
    return {"requests": reqs, "samples": samples, "cap": 64}


def test_the_cap_first_then_kv_is_the_sequence_limit_and_names_kv_second(tmp_path):
    d = run_of(tmp_path, run_id="cap_then_kv", **two_limits(cap_from_s=6.0, kv_from_s=12.0))
    assert d["label"] == "active-sequence limit", d["clue"]
    assert d["then_filled"] == "KV-capacity pressure at 12.0 s"
    assert d["clue"].startswith("both filled, active-sequence limit first: running at the cap from 6.0 s, "
                                "KV >= 90 % from 12.0 s;"), d["clue"]
    assert "vLLM's queue was 9" in d["clue"]


def test_kv_first_then_the_cap_is_kv_pressure_and_names_the_cap_second(tmp_path):
    d = run_of(tmp_path, run_id="kv_then_cap", **two_limits(cap_from_s=12.0, kv_from_s=6.0))
    assert d["label"] == "KV-capacity pressure", d["clue"]
    assert d["then_filled"] == "active-sequence limit at 12.0 s"
    assert d["clue"].startswith("both filled, KV-capacity pressure first: KV >= 90 % from 6.0 s, "
                                "running at the cap from 12.0 s;"), d["clue"]


def test_the_unseen_conversation_window_on_650_kv_blocks_gets_a_label(tmp_path):
    """The replay that came out `unclassified`: KV median 95.5 %, 47 preemptions, running at
    the cap 73 % of the loaded time, waiting up to 172, 99 % of TTFT in vLLM's queue."""
    at_cap_from = WINDOW[1] - 0.73 * (WINDOW[1] - WINDOW[0])
    run = two_limits(cap_from_s=round(at_cap_from * 4) / 4, kv_from_s=3.0, kv_pct=95.5, waiting=172,
                     preempt_every_s=(WINDOW[1] - 3.0) / 47)
    d = run_of(tmp_path, run_id="conv650", **run)
    assert d["running_at_cap_share"] == pytest.approx(0.73, abs=0.01)
    assert d["window_kv_median_pct"] == pytest.approx(95.5) and d["window_preemptions"] >= 40
    assert d["label"] == "KV-capacity pressure", d["clue"]  # KV crossed at 3.0 s, the cap at 6.75 s
    assert d["then_filled"] == "active-sequence limit at 6.8 s"


def test_crossed_at_the_same_scrape_the_one_that_held_longer_filled_first(tmp_path):
    reqs = queue(every(0.1, 200), 0.5, 64)
    d = run_of(tmp_path, run_id="tie", requests=reqs,
               samples=series(21, lambda t: 64 if t < 15 else 50, lambda t: 9, lambda t: 95))
    assert d["kv_full_share"] == 1 and d["running_at_cap_share"] < 1
    assert d["label"] == "KV-capacity pressure", d["clue"]
    assert d["then_filled"] == "active-sequence limit at 0.0 s"
    assert "(the same scrape: it held longer)" in d["clue"]


def test_a_run_with_one_limit_names_no_second(tmp_path):
    for run in (kv_pressure_run(), reference_run()):
        assert run_of(tmp_path, **run)["then_filled"] is None


def bursty_code_window(tmp_path, queue_share, run_id):
    """Bursts of 40 requests every 10 s, each burst's TTFT mostly vLLM's queue: waiting > 0
    only 8 % of the loaded time, running never near the cap of 64, KV at most 30 %."""
    reqs = []
    for burst in range(3):
        for i in range(40):
            t = 10.0 * burst + 0.01 * i
            ttft = 1.0
            reqs.append(request(len(reqs), t, t + ttft, t + ttft + 0.5) | {
                "server_queue_ms": queue_share * ttft * 1000, "server_prefill_ms": (1 - queue_share) * ttft * 900})
    waiting = lambda t: 32 if (t % 10) < 0.9 else 0  # noqa: E731
    return run_of(tmp_path, run_id=run_id, requests=reqs,
                  samples=series(31, lambda t: 29 if (t % 10) < 2 else 2, waiting, lambda t: 30 if (t % 10) < 2 else 2))


def test_a_run_whose_requests_spent_most_of_their_ttft_in_the_queue_is_not_a_reference(tmp_path):
    d = bursty_code_window(tmp_path, 0.71, "bursty")
    assert d["waiting_share"] < DiagnosisRules().reference_max_waiting_share  # the time alone said reference
    assert d["window_queue_share"] == pytest.approx(0.71, abs=0.01)
    assert d["label"] == "unclassified", d["clue"]
    assert d["clue"] == ("requests queued (waiting 8 % of the time, vLLM's queue 71 % of TTFT) with neither limit "
                         "full (running at most 29 of 64, at the cap 0 %; KV at most 30 %): something else filled, "
                         "e.g. the per-step token budget under long prompts"), d["clue"]
    # the same bursts with little of their TTFT queued are a reference run
    d = bursty_code_window(tmp_path, 0.05, "bursty_unqueued")
    assert d["label"] == "reference", d["clue"]


def test_a_limit_reached_with_nothing_queued_says_so(tmp_path):
    """A closed loop at the cap (or KV filling while nobody waits): full, not limiting."""
    reqs = queue(every(0.1, 200), 0.5, 64)
    d = run_of(tmp_path, run_id="at_cap_idle_queue", requests=reqs,
               samples=series(21, lambda t: 64, lambda t: 0, lambda t: 10))
    assert d["label"] == "unclassified"
    assert d["clue"] == ("running at the cap 100 % of the loaded time, but nothing queued (waiting 0 % of the "
                         "time): full, not yet what limits"), d["clue"]
