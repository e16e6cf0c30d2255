"""The request path: TTFT split by vLLM's per-request timings, and the diagnosis rules with
and without them (the synthetic runs of helpers/synthetic_db.py)."""

from __future__ import annotations

import duckdb
import pytest

from filledfirst.analysis import request_path
from filledfirst.study import DiagnosisRules

from helpers.synthetic_db import (
    every,
    gauges,
    interference_run,
    kv_pressure_run,
    make_db,
    queue,
    request,
    run_of,
    timed,
)


def db_of(tmp_path, name, requests, samples=()):
    return duckdb.connect(str(make_db(tmp_path / f"{name}.duckdb",
                                      [{"run_id": name, "requests": requests, "samples": list(samples)}])),
                          read_only=True)


# --- the decomposition ---------------------------------------------------------------------


def test_the_parts_add_up_to_ttft_and_are_null_where_the_server_sent_none(tmp_path):
    reqs = [
        # arrived at 1.0, sent 5 ms late; TTFT from send 300 ms: 200 queued, 80 prefill, 20 left
        request(0, 1.0, 1.305, 2.0, t_sent=1.005) | {"server_queue_ms": 200.0, "server_prefill_ms": 80.0,
                                                    "server_decode_ms": 695.0},
        request(1, 1.1, 1.2, 1.5),  # no timings: another server, or an older vLLM
        request(2, 1.2, None, 1.3, status="timeout") | {"server_queue_ms": 1.0, "server_prefill_ms": 1.0},
    ]
    con = db_of(tmp_path, "parts", reqs)
    rows = {r["request_id"]: r for r in request_path.signals.query(
        con, f"SELECT * FROM ({request_path.REQUEST_PARTS}) ORDER BY request_id").to_dicts()}
    a = rows[0]
    assert (a["dispatch_ms"], a["queue_ms"], a["prefill_ms"], a["decode_ms"]) == pytest.approx((5, 200, 80, 695))
    assert a["front_end_ms"] == pytest.approx(20)
    assert sum(a[col] for col, _ in request_path.TTFT_PARTS) == pytest.approx(a["ttft_ms"]) == pytest.approx(305)
    assert a["timed"] and a["t_prefill_start"] == pytest.approx(1.305 - 0.080)
    b = rows[1]
    assert not b["timed"] and b["ttft_ms"] == pytest.approx(100) and b["dispatch_ms"] == 0
    assert b["front_end_ms"] is None and b["queue_ms"] is None and b["prefill_ms"] is None
    assert not rows[2]["timed"] and rows[2]["queue_ms"] is None  # only requests that succeeded split
    share = request_path.queue_shares(con).to_dicts()[0]
    assert share == {"run_id": "parts", "n_ok": 2, "n_timed": 1, "queue_share": pytest.approx(200 / 305)}


def test_parts_around_p50_and_p90_by_role(tmp_path):
    # 20 decode requests, TTFT 100..290 ms from send, of which i x 10 ms queued
    reqs = [timed(request(i, float(i), i + 0.1 + 0.01 * i, i + 1.0), queue_s=0.01 * i) for i in range(20)]
    reqs.append(request(20, 30.0, 30.05, 30.5, role="probe"))  # a role the server sent nothing for
    con = db_of(tmp_path, "bands", reqs)
    rows = request_path.ttft_parts(con, "bands").to_dicts()
    assert [(r["role"], r["q"]) for r in rows] == [("decode", 0.5), ("decode", 0.9), ("probe", 0.5), ("probe", 0.9)]
    p50, p90, probe = rows[0], rows[1], rows[2]
    # ranks 0, 1/19, ...: the two around 0.5 (9/19, 10/19) are 0.026 away, inside the 0.05 band
    assert p50["n_band"] == 2 and p50["ttft_ms"] == pytest.approx((190 + 200) / 2)
    assert p50["queue_ms"] == pytest.approx(95) and p50["front_end_ms"] == pytest.approx(2)
    assert p50["ttft_q_ms"] == pytest.approx(195)
    assert sum(p50[col] for col, _ in request_path.TTFT_PARTS) == pytest.approx(p50["ttft_ms"])
    assert p90["n_band"] == 2 and p90["ttft_ms"] == pytest.approx((270 + 280) / 2)  # ranks 17/19 and 18/19
    assert (probe["n_ok"], probe["n_timed"], probe["n_band"]) == (1, 0, 0)
    assert probe["queue_ms"] is None and probe["ttft_ms"] is None


def test_our_ttft_against_the_servers_request_by_request(tmp_path):
    reqs = [timed(request(i, float(i), i + 0.1, i + 0.5), queue_s=0.05, front_s=0.001 * (i + 1)) for i in range(10)]
    # the server's part longer than our whole TTFT from send: a clock or parsing error of ours
    reqs.append(request(10, 20.0, 20.1, 20.5) | {"server_queue_ms": 90.0, "server_prefill_ms": 20.0})
    reqs.append(request(11, 21.0, 21.1, 21.5))
    c = request_path.against_server(db_of(tmp_path, "check", reqs)).to_dicts()[0]
    assert (c["n_ok"], c["n_timed"], c["n_server_longer"]) == (12, 11, 1)
    assert c["front_end_p50_ms"] == pytest.approx(5.0) and c["front_end_max_ms"] == pytest.approx(10.0)
    assert 0.9 < c["server_share_p50"] < 1.0


# --- the diagnosis with and without the server's timings -----------------------------------


def seq_limit_run(run_id, with_timings, queue_s=None):
    reqs = queue(every(0.1, 200), 1.2, 8)  # 10 arrivals/s against 8 slots of 1.2 s: the queue grows
    if with_timings:
        reqs = [timed(r, queue_s) for r in reqs]
    return {"run_id": run_id, "cap": 8, "requests": reqs, "samples": gauges(reqs, 32, lambda n: 1.5 * n)}


def test_sequence_limit_with_the_queue_measured(tmp_path):
    d = run_of(tmp_path, **seq_limit_run("seq", with_timings=True))
    assert d["label"] == "active-sequence limit", d["clue"]
    assert d["window_queue_share"] > 0.95 and d["window_timed"] == 180
    assert d["clue"].endswith("; vLLM's queue was 99 % of the TTFT of the 180 requests arriving in the loaded "
                              "window (its per-request timings)")
    d = run_of(tmp_path, **seq_limit_run("seq_gauges", with_timings=False))
    assert d["label"] == "active-sequence limit", d["clue"]
    assert d["window_queue_share"] is None and d["window_timed"] == 0
    assert d["clue"].endswith("; gauges only: the server reported no per-request timings")


def test_gauges_alone_would_call_a_wait_outside_the_queue_a_sequence_limit(tmp_path):
    # The same gauges (at the cap, a queue), but vLLM says its requests waited 20 ms in its
    # queue: their TTFT went elsewhere (here the front end), which the cap does not explain.
    run = seq_limit_run("front", with_timings=True, queue_s=0.02)
    for r in run["requests"]:
        r["server_prefill_ms"] = 30.0  # the rest of TTFT is front end and transport
    d = run_of(tmp_path, **run)
    assert d["label"] == "unclassified", d["clue"]
    assert 0 < d["window_queue_share"] < 0.005
    assert d["clue"] == ("the gauges saw requests waiting 100 % of the time, but vLLM's queue was only 0 % of their "
                         "TTFT (needs >= 25 %): they waited outside its queue")
    # without the server's timings the gauges alone give the label
    assert run_of(tmp_path, **seq_limit_run("front_gauges", with_timings=False))["label"] == "active-sequence limit"
    # the threshold is a rule
    d = run_of(tmp_path, DiagnosisRules(queue_min_ttft_share=0.001), **run | {"run_id": "front_low"})
    assert d["label"] == "active-sequence limit", d["clue"]


def test_kv_pressure_needs_the_queue_to_dominate_too(tmp_path):
    run = kv_pressure_run("kvq")
    run["requests"] = [timed(r) for r in run["requests"]]
    d = run_of(tmp_path, **run)
    assert d["label"] == "KV-capacity pressure", d["clue"]
    assert "; vLLM's queue was 9" in d["clue"] and d["window_queue_share"] > 0.9
    run = kv_pressure_run("kvfront")
    run["requests"] = [timed(r, queue_s=0.0) for r in run["requests"]]  # never queued: scheduled at once
    d = run_of(tmp_path, **run)
    # a preempted request waits in the queue again, and its timings count that wait as prefill:
    # with preemptions, the gauges' queue stands
    assert d["label"] == "KV-capacity pressure", d["clue"]
    assert d["window_preemptions"] > 0 and d["window_queue_share"] < 0.05
    run["samples"] = [s for s in run["samples"] if "preemptions" not in s[1]]
    d = run_of(tmp_path, **run | {"run_id": "kvfront_nopre"})
    assert d["label"] == "unclassified" and "they waited outside its queue" in d["clue"], d["clue"]


def test_interference_outside_the_queue_is_interference(tmp_path):
    run = interference_run("int_t")
    run["requests"] = [timed(r, queue_s=0.0) for r in run["requests"]]  # slow in prefill, not queued
    d = run_of(tmp_path, **run)
    assert d["label"] == "prefill-decode interference", d["clue"]
    assert d["interference_prefill_ratio"] == pytest.approx(1.5 / 0.05)  # nothing queued: all of TTFT
    # the long prompts (sent at 2 s, first token at 4 s, 1,998 ms of prefill) span the same probes
    assert d["clue"] == ("8 requests arriving during long prefills (vLLM's prefill intervals): TTFT p90 30.0x "
                         "that of the other 36; outside vLLM's queue 30.0x (its per-request timings)")


def test_gauges_alone_would_call_a_queue_behind_a_long_prompt_interference(tmp_path):
    # The probes behind the long prompts waited in vLLM's queue (not at a full cap or KV,
    # so the gauge rule keeps them): queueing, not a prefill slowed down.
    run = interference_run("intq")
    reqs = []
    for r in run["requests"]:
        slow = r["role"] == "probe" and r["t_first_token"] - r["t_scheduled"] > 1
        reqs.append(timed(r | {"_start": r["t_scheduled"] + 1.4 if slow else r["_start"]},
                          queue_s=1.44 if slow else 0.0))
    run = run | {"requests": reqs, "samples": gauges(reqs, 31, lambda n: 0.5 * n)}
    d = run_of(tmp_path, **run)
    assert d["label"] != "prefill-decode interference", d["clue"]
    assert d["interference_ratio"] == pytest.approx(30) and d["interference_prefill_ratio"] < 1.5
    # a queue with no limit full: the step in flight (the long prefill) held it, and the
    # interference ratios that did not make it interference
    assert d["label"] == "compute-bound", d["clue"]
    assert d["clue"].startswith("the step in flight held 100 % of the waiting, with no limit full"), d["clue"]
    assert ("(prefill-decode interference: TTFT p90 30.0x that of the other 36 but outside vLLM's queue 1.2x "
            "(needs >= 2x))") in d["clue"]
    without = run | {"run_id": "intq_gauges", "requests": [
        {k: v for k, v in r.items() if not k.startswith("server_")} for r in reqs]}
    assert run_of(tmp_path, **without)["label"] == "prefill-decode interference"


def test_a_long_prompts_prefill_runs_from_its_scheduling_not_its_send(tmp_path):
    # The long prompts (sent at 2.0 s) waited 0.5 s in vLLM's queue, then prefilled to 4 s:
    # probes arriving before 2.5 s met a queue, not a prefill; those slowed are the later ones.
    run = interference_run("sched")
    reqs = []
    for r in run["requests"]:
        if r["role"] == "long_prompt":
            r = timed(r, queue_s=0.5)
        elif r["role"] == "probe" and r["t_scheduled"] < 2.5:
            r = timed(r | {"t_first_token": r["t_scheduled"] + 0.05}, queue_s=0.0)  # not slowed
        else:
            r = timed(r, queue_s=0.0)
        reqs.append(r)
    d = run_of(tmp_path, **run | {"requests": reqs})
    assert d["label"] == "prefill-decode interference", d["clue"]
    assert d["clue"].startswith("6 requests arriving during long prefills (vLLM's prefill intervals): TTFT p90 30.0x "
                                "that of the other 38"), d["clue"]
    # from their send, the two early probes count as behind the long prompts
    without = [{k: v for k, v in r.items() if not k.startswith("server_")} for r in reqs]
    d = run_of(tmp_path, **run | {"run_id": "sched_gauges", "requests": without})
    assert d["clue"].startswith("8 requests arriving during long prefills: TTFT p90 30.0x that of the other 36 "
                                "(gauges and client times: no per-request server timings"), d["clue"]


def test_an_old_database_gains_the_columns_when_diagnosed(tmp_path):
    from filledfirst.analysis.diagnosis import write_diagnosis

    db = make_db(tmp_path / "old.duckdb", [seq_limit_run("old", with_timings=False)])
    with duckdb.connect(str(db)) as con:
        for col in ("server_queue_ms", "server_prefill_ms", "server_decode_ms", "server_itl_ms"):
            con.execute(f"ALTER TABLE requests DROP COLUMN {col}")
    labels = write_diagnosis(db, DiagnosisRules())
    assert labels["label"].to_list() == ["active-sequence limit"]
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(server_queue_ms) FROM requests").fetchall() == [(0,)]
        assert request_path.queue_shares(con)["queue_share"].to_list() == [None]



def test_the_glance_number_of_a_limit_carries_its_queue(tmp_path):
    from filledfirst.contracts.diagnosis import DiagnosisRow
    from filledfirst.report.frontiers import key_number

    rules = DiagnosisRules()
    d = run_of(tmp_path, **seq_limit_run("glance", with_timings=True))
    assert key_number(DiagnosisRow.from_columns(d), rules) == "waiting held by cap 100 %, vLLM's queue 99 % of TTFT"
    d = run_of(tmp_path, **seq_limit_run("glance_gauges", with_timings=False))
    assert key_number(DiagnosisRow.from_columns(d), rules) == "waiting held by cap 100 %"
    run = interference_run("glance_int")
    d = run_of(tmp_path, **run | {"requests": [timed(r, queue_s=0.0) for r in run["requests"]]})
    assert key_number(DiagnosisRow.from_columns(d), rules) == ("TTFT p90 30.0x higher behind a long prompt "
                                                               "(30.0x outside vLLM's queue)")
