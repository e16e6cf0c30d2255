"""What filled first on traffic nobody designed: two limits filling in one run, a run
whose requests queued in short bursts, and a queue behind the per-step token budget
(synthetic databases reproducing what unseen replays showed). What held the waiting is
read scrape by scrape in the scheduler's order (filledfirst.analysis.diagnosis.scheduler),
and the run's label is what held most of it."""

from __future__ import annotations

import pytest

from filledfirst.study import DiagnosisRules

from helpers.synthetic_db import (
    RUNNING,
    every,
    gauges,
    kv_pressure_run,
    queue,
    reference_run,
    request,
    run_of,
    series,
    step_counters,
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
    # the cap held the queue from 6 s; from 12 s the preemptions held it at every other scrape
    assert d["label"] == "active-sequence limit", d["clue"]
    assert d["bound"] == "cap 73 %, preemption 27 %"
    assert d["then_filled"] == "KV-capacity pressure (27 % of the waiting)"
    assert d["clue"].startswith("the cap held 73 % of the waiting (running at most 64 of 64"), d["clue"]
    assert "vLLM's queue was 9" in d["clue"]


def test_kv_first_then_the_cap_is_kv_pressure_and_names_the_cap_second(tmp_path):
    d = run_of(tmp_path, run_id="kv_then_cap", **two_limits(cap_from_s=12.0, kv_from_s=6.0))
    assert d["label"] == "KV-capacity pressure", d["clue"]
    assert d["then_filled"] == "active-sequence limit (28 % of the waiting)"
    assert d["clue"].startswith("KV blocks held 23 % of the waiting and preemptions 49 %"), d["clue"]


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
    assert d["then_filled"] == "active-sequence limit (24 % of the waiting)"


def test_full_from_the_same_scrape_the_cap_holds_while_the_running_set_is_full(tmp_path):
    reqs = queue(every(0.1, 200), 0.5, 64)
    d = run_of(tmp_path, run_id="tie", requests=reqs,
               samples=series(21, lambda t: 64 if t < 15 else 50, lambda t: 9, lambda t: 95))
    assert d["kv_full_share"] == 1 and d["running_at_cap_share"] < 1
    # vLLM admits nobody past a full running set; once it has slots, full KV holds the queue
    assert d["label"] == "active-sequence limit", d["clue"]
    assert d["bound"] == "cap 73 %, KV blocks 27 %"
    assert d["then_filled"] == "KV-capacity pressure (27 % of the waiting)"


def test_a_run_with_one_limit_names_no_second(tmp_path):
    for run in (kv_pressure_run(), reference_run()):
        assert run_of(tmp_path, **run)["then_filled"] is None


def in_burst(t):
    return 0 < t % 10 <= 1.0  # the intervals opened by a scrape that saw the burst's queue


def bursty_code_window(tmp_path, queue_share, run_id, budget=None, fill=None, rules=DiagnosisRules()):
    """Bursts of 40 requests every 10 s, each burst's TTFT mostly vLLM's queue: waiting > 0
    only 8 % of the loaded time, running never near the cap of 64, KV at most 30 %. With
    `budget`: the engine ran with that per-step token budget, and with `fill` the 20 steps
    between two scrapes of a burst used that share of it on average (the 30 steps between
    two others, decoding, 2 tokens each)."""
    reqs = []
    for burst in range(3):
        for i in range(40):
            t = 10.0 * burst + 0.01 * i
            ttft = 1.0
            reqs.append(request(len(reqs), t, t + ttft, t + ttft + 0.5) | {
                "server_queue_ms": queue_share * ttft * 1000, "server_prefill_ms": (1 - queue_share) * ttft * 900})
    waiting = lambda t: 32 if (t % 10) < 0.9 else 0  # noqa: E731
    samples = series(31, lambda t: 29 if (t % 10) < 2 else 2, waiting, lambda t: 30 if (t % 10) < 2 else 2)
    if fill is not None:
        samples += step_counters(31, lambda t: (20, 20 * budget * fill) if in_burst(t) else (30, 60))
    meta = {"server": {"max_num_batched_tokens": budget}} if budget else {}
    return run_of(tmp_path, rules, run_id=run_id, requests=reqs, samples=samples, meta=meta)


def test_a_run_whose_requests_spent_most_of_their_ttft_in_the_queue_is_not_a_reference(tmp_path):
    d = bursty_code_window(tmp_path, 0.71, "bursty")
    assert d["waiting_share"] < DiagnosisRules().waiting_min_share  # the time alone said reference
    assert d["window_queue_share"] == pytest.approx(0.71, abs=0.01)
    # the cap had slots and KV room: the step in flight held them, the budget untested
    assert d["label"] == "compute-bound", d["clue"]
    assert d["clue"].startswith("the step in flight held 100 % of the waiting, with no limit full; the token budget "
                                "not tested (the per-step token budget unknown (its use not measured))"), d["clue"]
    assert "the per-step token budget's use not measured: the server's log and settings do not say it" in d["notes"]
    # the same bursts with little of their TTFT queued are a reference run
    d = bursty_code_window(tmp_path, 0.05, "bursty_unqueued")
    assert d["label"] == "reference", d["clue"]


def test_a_limit_reached_with_nothing_queued_says_so(tmp_path):
    """A closed loop at the cap (or KV filling while nobody waits): full, not limiting."""
    reqs = queue(every(0.1, 200), 0.5, 64)
    d = run_of(tmp_path, run_id="at_cap_idle_queue", requests=reqs,
               samples=series(21, lambda t: 64, lambda t: 0, lambda t: 10))
    assert d["label"] == "reference" and d["running_at_cap_share"] == 1
    assert d["clue"] == "nothing queued (waiting 0 % of the time), running median 64 of 64, KV median 10 %", d["clue"]


def test_a_queue_behind_steps_that_used_the_whole_token_budget_is_the_prefill_token_budget(tmp_path):
    """The bursty window again, its engine at a 2,048-token budget that its steps used up
    (95 % on average) while requests waited: the budget is what filled."""
    d = bursty_code_window(tmp_path, 0.86, "budget", budget=2048, fill=0.95)
    # 5 intervals of 20 steps (the window ends at 20.39 s)
    assert d["token_budget"] == 2048 and d["budget_queued_steps"] == 100
    assert d["budget_fill"] == pytest.approx(0.95)
    assert d["label"] == "prefill token budget", d["clue"]
    from filledfirst.contracts.diagnosis import DiagnosisRow
    from filledfirst.report.frontiers import key_number  # "At a glance"'s number for it

    assert key_number(DiagnosisRow.from_columns(d), DiagnosisRules()) == (
        "waiting held by token budget 100 %, vLLM's queue 86 % of TTFT")
    assert d["clue"].startswith("full steps held 100 % of the waiting (the 100 engine steps while requests waited "
                                "used 95 % of the token budget (2048) on average)"), d["clue"]


def test_a_queue_whose_steps_left_budget_unused_is_not_the_token_budget(tmp_path):
    d = bursty_code_window(tmp_path, 0.86, "budget_unused", budget=2048, fill=0.3)
    assert d["budget_fill"] == pytest.approx(0.3)
    assert d["label"] == "compute-bound", d["clue"]
    # 85 % is enough by default; a stricter threshold is not met
    assert bursty_code_window(tmp_path, 0.86, "budget_85", budget=2048, fill=0.85)["label"] == "prefill token budget"
    d = bursty_code_window(tmp_path, 0.86, "budget_strict", budget=2048, fill=0.85,
                           rules=DiagnosisRules(budget_min_fill=0.9))
    assert d["label"] == "compute-bound"


def test_a_prompt_counted_at_its_last_chunk_shows_past_its_budget(tmp_path):
    # vLLM's step histogram counts a chunked prompt's tokens at the step that finishes it
    d = bursty_code_window(tmp_path, 0.86, "budget_lumpy", budget=2048, fill=1.1)
    assert d["budget_fill"] == pytest.approx(1.1) and d["label"] == "prefill token budget"


def test_a_known_budget_without_the_step_histogram_says_its_use_was_not_measured(tmp_path):
    d = bursty_code_window(tmp_path, 0.86, "budget_no_steps", budget=2048)
    assert d["budget_fill"] is None and d["label"] == "compute-bound"
    assert "the token budget not tested (the use of the token budget (2048) not measured (no step histogram))" in (
        d["clue"]), d["clue"]
    assert "the per-step token budget's use not measured: no step histogram was scraped" in d["notes"]


def shared_documents(tmp_path, run_id, caching=True, served=0.0, kv_pct=70.0):
    """Prompts of 1,152 tokens whose first 1,024 an unbounded cache would serve (the shared
    documents), queueing (ten slots for requests every 0.05 s), with running requests
    holding `kv_pct` % of KV: vLLM counts the cached blocks no request holds as free, so
    the gauge stays short of full while they are evicted. `served`: the share of the
    documents the cache served."""
    reqs = [timed(r) | {"ideal_cached_tokens": 1024, "cached_tokens": int(1024 * served)}
            for r in queue(every(0.05, 300), 1.0, 10, prompt=1152, output=16)]
    samples = gauges(reqs, 32, lambda n: kv_pct * n / 10)
    return run_of(tmp_path, run_id=run_id, requests=reqs, samples=samples,
                  meta={"server": {"settings": {"max_num_seqs": 64, "enable_prefix_caching": caching}}})


def test_a_cache_that_lost_its_reuse_is_eviction_though_kv_never_read_full(tmp_path):
    """The designed eviction run that came out `unclassified` on a fast machine: queued,
    the cache serving none of the shared documents, KV held by running requests below
    90 %."""
    d = shared_documents(tmp_path, "evicted")
    assert d["window_kv_max_pct"] < DiagnosisRules().kv_full_pct and d["kv_full_share"] == 0
    assert d["cache_efficiency"] == 0 and d["ideal_hit_share"] == pytest.approx(1024 / 1152)
    assert d["label"] == "prefix-cache eviction", d["clue"]
    assert "KV held by running requests at most 70 %" in d["clue"], d["clue"]


def test_the_same_queue_with_the_cache_delivering_or_off_is_not_eviction(tmp_path):
    for run_id, kwargs in (("delivered", {"served": 0.9}), ("off", {"caching": False})):
        d = shared_documents(tmp_path, run_id, **kwargs)
        assert d["label"] == "compute-bound", (run_id, d["clue"])


GENERATED = "vllm:generation_tokens_total"


@pytest.mark.parametrize("pods", [1, 2])
def test_scrapes_of_several_servers_behind_one_address_are_flagged(tmp_path, pods):
    """/metrics behind a load balancer answers from a different server at each scrape: each
    server's counter rises on its own, so the series the run recorded goes up and down. One
    server's never goes down."""
    run = reference_run(f"pods{pods}")
    times = sorted({t for t, m, _ in run["samples"] if m == RUNNING})
    # pod k has generated 5,000 x k tokens before the run, and 40 a second since
    run["samples"] += [(t, GENERATED, 5000 * (i % pods) + 40 * t) for i, t in enumerate(times)]
    d = run_of(tmp_path, **run)
    mixed = [w for w in (d["warnings"] or "").split("; ") if w.startswith("mixed servers")]
    if pods == 1:
        assert mixed == []
    else:
        drops = (len(times) - 1) // 2  # every other scrape reads the pod that generated less
        assert mixed == [f"mixed servers (the generated-token counter went down {drops} times between scrapes: "
                         "the server restarted, or /metrics sits behind a load balancer and read several "
                         "servers, whose scheduler signals are mixed here: scrape one server's own address)"]
