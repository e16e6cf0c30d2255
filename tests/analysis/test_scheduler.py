"""What held a waiting request, scrape by scrape and engine by engine, in the order vLLM's
scheduler checks it (filledfirst.analysis.diagnosis.scheduler): preemption, the cap, the
head of the queue's blocks, the step's token budget, else the step in flight. Each run
below is one the old rules (thresholds on shares of the whole window's time: at the cap
>= 50 % of it with cap_frac 0.9, KV >= 90 % for >= 20 % of it, waiting >= 20 % of it, and
vLLM's queue >= 50 % of TTFT for a limit) got wrong; each test says how."""

from __future__ import annotations

import msgspec
import pytest

from filledfirst.analysis.diagnosis import scheduler
from filledfirst.contracts.scheduler import Constraint, SchedulerState
from filledfirst.study import DiagnosisRules

from helpers.synthetic_db import (
    FRONT_S,
    every,
    gauges,
    queue,
    request,
    run_of,
    series,
    step_counters,
    timed,
)

DT = 0.25  # the scrape interval of every run below
PREEMPTIONS = "vllm:num_preemptions_total"
PROMPT_COMPUTED = "vllm:prompt_tokens_by_source_total"


def scrapes(t_end, dt=DT):
    return [k * dt for k in range(int(t_end / dt) + 1)]


def cache_config(t_end, num_gpu_blocks, block_size, engine="0"):
    """vLLM's cache settings, as an info series at every scrape."""
    labels = f"engine={engine},num_gpu_blocks={num_gpu_blocks},block_size={block_size}"
    return [(t, "vllm:cache_config_info", 1.0, labels) for t in scrapes(t_end)]


def counter(t_end, metric, per_interval, labels="engine=0"):
    """A cumulative counter at every scrape: `per_interval(t)` is its rise over the interval ending at t."""
    total, out = 0.0, []
    for k, t in enumerate(scrapes(t_end)):
        total += per_interval(t) if k else 0.0
        out.append((t, metric, total, labels))
    return out


def waiting_in(rows):
    """The waiting gauge the requests' own times give: in vLLM's queue (from the front end,
    FRONT_S after the send) and not yet started."""
    return lambda t: sum(r["t_sent"] + FRONT_S <= t < r["_start"] for r in rows)


def steady(prompt, decode_s, budget, step_tokens):
    """A request every 0.1 s for 20 s, each queued 0.2 s, prefilled in 0.4 s (chunk by chunk,
    four at a time) and decoding `decode_s`: two waiting at every scrape, vLLM's queue a third
    of TTFT. Steps every 10 ms carrying `step_tokens`, the prompts' and the decodes' tokens."""
    rows = [timed(request(i, t, t + 0.602, t + 0.602 + decode_s, prompt=prompt, start=t + 0.2), queue_s=0.2)
            for i, t in enumerate(every(0.1, 200))]
    samples = series(21, lambda t: sum(r["t_sent"] + 0.202 <= t < r["t_done"] for r in rows), waiting_in(rows),
                     lambda t: 20)
    samples += step_counters(21, lambda t: (25, 25 * step_tokens))
    decoding = 10 * decode_s  # requests, a token each per step
    samples += counter(21, "vllm:generation_tokens_total", lambda t: 25 * decoding)
    samples += counter(21, PROMPT_COMPUTED, lambda t: 0.25 * 10 * prompt, labels="engine=0,source=local_compute")
    return {"requests": rows, "samples": samples, "meta": {"server": {"max_num_batched_tokens": budget}}}


# --- what held a state: the order and the split ------------------------------------------------


def state(**kw) -> SchedulerState:
    """A state with a queue of 5 and nothing full: 10 of 16 running, the head's 100 blocks of
    500 free, 10 steps to the next scrape at 200 of their 512 tokens, no preemption."""
    base = dict(run_id="r", t=1.0, engine="0", running=10.0, waiting=5.0, cap=16, kv_pct=50.0, blocks=1000,
                blocks_free=500, block_size=16, budget=512, preempted=0.0, steps=10.0, step_tokens=2000.0,
                prompt_tokens=1500.0, step_ms=25.0, head_request=1, head_blocks=100, head_wait_s=0.5,
                constraint=None)
    s = SchedulerState(**(base | kw))
    return msgspec.structs.replace(s, constraint=scheduler.bind(s, DiagnosisRules()))


def test_bind_checks_preemption_then_the_cap_then_blocks_then_the_budget_then_compute():
    full_budget = 0.8 * 10 * 512
    assert state().constraint is Constraint.COMPUTE
    assert state(step_tokens=full_budget).constraint is Constraint.BUDGET
    assert state(step_tokens=full_budget, head_blocks=501).constraint is Constraint.KV
    assert state(step_tokens=full_budget, head_blocks=501, running=16).constraint is Constraint.CAP
    assert state(step_tokens=full_budget, head_blocks=501, running=16, preempted=1).constraint is Constraint.PREEMPTION
    assert state(waiting=0, running=16, preempted=1).constraint is None  # nothing waited: nothing held
    # the head known, its blocks decide, not the gauge; unknown, KV >= kv_full_pct stands in
    assert state(kv_pct=95.0, blocks_free=50, head_blocks=50).constraint is Constraint.COMPUTE
    assert state(kv_pct=95.0, head_blocks=None).constraint is Constraint.KV
    assert state(kv_pct=89.0, head_blocks=None).constraint is Constraint.COMPUTE
    # an unknown cap or budget is not tested
    assert state(cap=None, running=99).constraint is Constraint.COMPUTE
    assert state(budget=None, step_tokens=full_budget).constraint is Constraint.COMPUTE


def test_waiting_by_splits_the_queue_between_the_head_and_the_cap():
    # 2 slots free: 2 of the 5 wait for the step (or the budget), the other 3 for slots
    assert scheduler.waiting_by(state(running=14)) == {Constraint.COMPUTE: 2, Constraint.CAP: 3}
    assert scheduler.waiting_by(state(running=14, step_tokens=4096)) == {Constraint.BUDGET: 2, Constraint.CAP: 3}
    assert scheduler.waiting_by(state()) == {Constraint.COMPUTE: 5}
    # the head's blocks, the cap or a preemption hold the whole queue
    assert scheduler.waiting_by(state(running=14, head_blocks=600)) == {Constraint.KV: 5}
    assert scheduler.waiting_by(state(running=16)) == {Constraint.CAP: 5}
    assert scheduler.waiting_by(state(preempted=2)) == {Constraint.PREEMPTION: 5}
    assert scheduler.waiting_by(state(waiting=0)) == {}


# --- runs --------------------------------------------------------------------------------------


def test_bursts_against_a_small_cap_are_the_sequence_limit(tmp_path):
    # Old rules: running at 8 of 8 only during the bursts (12 % of the window, < 50 %) and
    # waiting > 0 8 % of it (< 20 %): no sequence limit ("requests queued with neither limit
    # full"), though the bursts' requests spent 77 % of their TTFT in vLLM's queue, at the cap.
    arrivals = [0.0] + [t0 + 0.02 * i for t0 in (4.0, 10.0, 16.0) for i in range(16)] + [20.0]
    reqs = [timed(r) for r in queue(arrivals, 0.5, 8)]
    d = run_of(tmp_path, run_id="burst_cap", cap=8, requests=reqs, samples=gauges(reqs, 21, lambda n: 1.5 * n))
    assert d["waiting_share"] < 0.1 and d["running_at_cap_share"] < 0.2
    assert d["window_queue_share"] > 0.5
    assert d["label"] == "active-sequence limit", d["clue"]
    assert d["held_by"] == "active-sequence limit" and d["bound"] == "cap 100 %" and d["then_filled"] is None
    assert d["clue"].startswith("the cap held 100 % of the waiting (running at most 8 of 8"), d["clue"]


def test_a_long_prompt_at_the_head_holds_the_queue_with_kv_below_full(tmp_path):
    # Old rules: KV 70-84 % never reached 90 %, running 4 of 64: "neither limit full"
    # (unclassified). But vLLM admits in order: the 13,000-token prompt at the head needs 813
    # blocks of 16 with only 300 (later 160) of 1000 free, and everyone queues behind it.
    reqs = [timed(request(i, 0.1 * i, 0.1 * i + 0.05, 21.0, prompt=500, output=2000)) for i in range(4)]
    reqs.append(timed(request(4, 2.0, 20.0, 20.5, prompt=13000, start=19.0)))  # the head, admitted at 19 s
    reqs += [timed(request(5 + i, t, 19.1 + 0.1 * i, 19.6 + 0.1 * i, prompt=200, start=19.05 + 0.1 * i))
             for i, t in enumerate(every(1.0, 16, 3.0))]  # behind it, FIFO
    samples = series(21, lambda t: 4 if t < 19 else 10, waiting_in(reqs), lambda t: 70 if t < 10 else 84)
    samples += cache_config(21, num_gpu_blocks=1000, block_size=16)
    d = run_of(tmp_path, run_id="head_blocks", requests=reqs, samples=samples)
    assert d["window_kv_max_pct"] == pytest.approx(84) and d["kv_full_share"] == 0
    assert d["label"] == "KV-capacity pressure", d["clue"]
    assert d["held_by"] == "KV-capacity pressure" and d["bound"] == "KV blocks 100 %"
    assert d["clue"].startswith("KV blocks held 100 % of the waiting and preemptions 0 %: the head of the queue "
                                "needed 813 blocks with 300 free (KV 70 % used)"), d["clue"]


def test_a_preemption_storm_is_kv_pressure_though_the_first_queue_was_short(tmp_path):
    # Old rules: KV read 85 % (< 90 %: vLLM publishes it after the preemption freed blocks)
    # and vLLM's queue was 10 % of TTFT (< 50 %: a preempted request's second wait is counted
    # as its prefill): no KV pressure. Every scrape's interval saw a preemption.
    base = queue(every(0.05, 300), 1.0, 10, prompt=900, output=300)
    reqs = [timed(r, queue_s=0.1 * (r["t_first_token"] - r["t_sent"])) for r in base]
    samples = gauges(reqs, 32, lambda n: 8.5 * n) + counter(32, PREEMPTIONS, lambda t: 1.0)
    d = run_of(tmp_path, run_id="preempt_storm", requests=reqs, samples=samples)
    assert d["window_queue_share"] < 0.25 and d["window_kv_max_pct"] < 90 and d["waiting_share"] > 0.2
    assert d["label"] == "KV-capacity pressure", d["clue"]
    assert d["held_by"] == "KV-capacity pressure" and d["bound"] == "preemption 100 %"
    assert d["clue"].startswith("KV blocks held 0 % of the waiting and preemptions 100 %;"), d["clue"]


def test_full_steps_hold_the_queue_below_the_cap_and_kv(tmp_path):
    # Old rules: any limit's label needed vLLM's queue >= 50 % of TTFT, but a queue behind
    # the budget is short and the prefill long (its chunks share the budget): 33 % here, so
    # "requests queued with neither limit full" (unclassified). Every step carried 490 of 512.
    d = run_of(tmp_path, run_id="budget", **steady(prompt=4800, decode_s=1.0, budget=512, step_tokens=490))
    assert d["window_queue_share"] == pytest.approx(0.33, abs=0.01) and d["window_running_max"] == 14
    assert d["label"] == "prefill token budget", d["clue"]
    assert d["held_by"] == "prefill token budget" and d["bound"] == "token budget 100 %"
    assert d["clue"].startswith("full steps held 100 % of the waiting (the "), d["clue"]
    assert "used 96 % of the token budget (512)" in d["clue"], d["clue"]


def test_a_queue_with_no_limit_full_is_compute_bound_with_its_phase(tmp_path):
    # Old rules: a queue (33 % of TTFT, < 50 %) with neither the cap nor KV full and the budget
    # unused was "unclassified" (no label for it). The steps' tokens say which phase.
    run = steady(prompt=4800, decode_s=1.0, budget=2048, step_tokens=490)  # 24 % of the budget
    d = run_of(tmp_path, run_id="compute", **run)
    assert d["label"] == "compute-bound", d["clue"]
    assert d["held_by"] == "compute-bound" and d["bound"] == "compute 100 %"
    assert d["step_ms"] == pytest.approx(10) and d["prefill_share"] == pytest.approx(0.98, abs=0.01)
    assert d["clue"].startswith("the step in flight held 100 % of the waiting, with no limit full; steps took "
                                "10 ms on average, 98 % of their tokens prompt: prefill"), d["clue"]
    # short prompts and long decodes: 250 prompt tokens of 1,000 per interval
    d = run_of(tmp_path, run_id="compute_decode", **steady(prompt=100, decode_s=3.0, budget=2048, step_tokens=40))
    assert d["label"] == "compute-bound", d["clue"]
    assert d["prefill_share"] == pytest.approx(0.25, abs=0.01) and "25 % of their tokens prompt: decode" in d["clue"]


def test_one_data_parallel_engine_at_its_cap_is_the_sequence_limit(tmp_path):
    # Old rules: running summed over engines, 8 + 1 = 9 against 0.9 x 8 x 2 = 14.4: never at
    # the cap, so "neither limit full". Engine 0 was at its own cap of 8 with a queue.
    reqs = [timed(r) for r in queue(every(0.1, 200), 1.0, 9)]
    samples = [(t, m, v, "engine=0") for t, m, v in series(21, lambda t: 8, lambda t: 5, lambda t: 20)]
    samples += [(t, m, v, "engine=1") for t, m, v in series(21, lambda t: 1, lambda t: 0, lambda t: 3)]
    d = run_of(tmp_path, run_id="dp_one_full", cap=8, requests=reqs, samples=samples)
    assert d["engines"] == 2 and d["running_at_cap_share"] == 0
    assert d["label"] == "active-sequence limit", d["clue"]
    assert d["held_by"] == "active-sequence limit" and d["bound"] == "cap 100 %"
    # engine 1 with a queue of its own behind a free slot: each engine named with its own
    samples = [(t, m, v, "engine=0") for t, m, v in series(21, lambda t: 8, lambda t: 6, lambda t: 20)]
    samples += [(t, m, v, "engine=1") for t, m, v in series(21, lambda t: 1, lambda t: 2, lambda t: 3)]
    d = run_of(tmp_path, run_id="dp_differ", cap=8, requests=reqs, samples=samples)
    assert d["label"] == "active-sequence limit" and d["bound"] == "cap 75 %, compute 25 %", d["bound"]
    assert "; engine by engine: 0 cap, 1 compute;" in d["clue"], d["clue"]


def test_an_effective_cap_below_max_num_seqs_is_the_cap(tmp_path):
    # Old rules: running 6 of max_num_seqs 64 is at the cap 0 % of the time: "neither limit
    # full". The server admitted at most max_num_active_seqs = 6.
    reqs = [timed(r) for r in queue(every(0.1, 200), 1.0, 6)]
    d = run_of(tmp_path, run_id="active_cap", cap=64, requests=reqs, samples=gauges(reqs, 21, lambda n: 1.5 * n),
               meta={"server": {"settings": {"max_num_seqs": 64, "max_num_active_seqs": 6}}})
    assert d["cap"] == 6
    assert d["label"] == "active-sequence limit", d["clue"]
    assert d["held_by"] == "active-sequence limit" and d["bound"] == "cap 100 %"
    assert d["clue"].startswith("the cap held 100 % of the waiting (running at most 6 of 6"), d["clue"]


def test_chunks_of_a_prefill_with_nothing_decoding_fill_the_budget_the_histogram_misses(tmp_path):
    # One 8,192-token prompt at a time under a 2,048-token budget, no decode beside it: three
    # of its four steps produce no output, so vLLM's step histogram sees one step a second,
    # and the interval's 2,048 prompt tokens over no step looked like compute. Each of those
    # chunks took a whole step's budget: the request queued behind it waited for the budget.
    arrivals = every(0.9, 20)
    reqs = [timed(r) for r in queue(arrivals, 1.01, 1, ttft_s=1.0, prompt=8192, output=1)]
    firsts = [r["t_first_token"] for r in reqs]

    def first_tokens(t):
        return sum(t - DT < f <= t for f in firsts)

    samples = gauges(reqs, 21, lambda n: 30) + cache_config(21, num_gpu_blocks=1000, block_size=16)
    samples += step_counters(21, lambda t: (first_tokens(t), 8193 * first_tokens(t)))
    samples += counter(21, "vllm:generation_tokens_total", first_tokens)
    samples += counter(21, PROMPT_COMPUTED, lambda t: 8192 * first_tokens(t), labels="engine=0,source=local_compute")
    d = run_of(tmp_path, run_id="chunked", cap=16, requests=reqs, samples=samples,
               meta={"server": {"max_num_batched_tokens": 2048}})
    assert d["label"] == "prefill token budget", d["clue"]
    assert d["bound"] == "token budget 100 %", d["bound"]
