"""What filled first: the label rules on synthetic runs of each pattern, their borderlines,
the side checks (Little's law, goodput, KV ledger)."""

from __future__ import annotations

import json
import random

import duckdb
import polars as pl
import pytest

from filledfirst.analysis import signals
from filledfirst.analysis.diagnosis import diagnose, write_diagnosis
from filledfirst.analysis.diagnosis.storage import stored_rules
from filledfirst.cli import main
from filledfirst.errors import UserError
from filledfirst.model.kv import kv_record
from filledfirst.store.ingest import DDL
from filledfirst.study import DiagnosisRules

from helpers.synthetic_db import (
    KV,
    RUNNING,
    WAITING,
    every,
    gauges,
    interference_run,
    kv_pressure_run,
    make_db,
    queue,
    reference_run,
    request,
    run_of,
    series,
)


def test_reference(tmp_path):
    d = run_of(tmp_path, **reference_run())
    assert d["label"] == "reference", d["clue"]
    assert d["clue"].startswith("nothing queued (waiting 0 % of the time), running median 5 of 64, KV median 2.5 %")
    assert d["bound"] is None and d["waited_request_s"] == 0 and d["held_by"] is None
    assert d["warnings"] == "" and d["littles_ok"] and 0.9 < d["littles_ratio"] < 1.1
    assert d["window_start_s"] == pytest.approx(1.99) and d["window_end_s"] == pytest.approx(19.9)
    assert d["first_crossings"] == "waiting>0 never, running at cap never, KV>=90 % never"
    assert d["interference_ratio"] is None and d["slo_met_share"] == 1.0


def test_active_sequence_limit(tmp_path):
    reqs = queue(every(0.1, 200), 1.2, 8)  # 10 arrivals/s against 8 slots of 1.2 s: the queue grows
    d = run_of(tmp_path, run_id="lim", cap=8, requests=reqs, samples=gauges(reqs, 32, lambda n: 1.5 * n))
    assert d["label"] == "active-sequence limit", d["clue"]
    assert d["running_at_cap_share"] > 0.9 and d["waiting_share"] > 0.9
    assert d["clue"].startswith("the cap held 100 % of the waiting (running at most 8 of 8, KV median 12 %)")
    assert d["bound"] == "cap 100 %" and d["held_by"] == "active-sequence limit"
    assert d["first_crossings"] == "running at cap at 0.8 s, waiting>0 at 1.0 s; KV>=90 % never"
    assert d["littles_ok"]


def test_kv_capacity_pressure(tmp_path):
    d = run_of(tmp_path, **kv_pressure_run())
    assert d["label"] == "KV-capacity pressure", d["clue"]
    assert d["running_at_cap_share"] == 0 and d["kv_full_share"] > 0.9 and d["window_preemptions"] == 4
    # no server timings say who was at the head of the queue: KV >= kv_full_pct stands in
    assert d["clue"].startswith("KV blocks held 93 % of the waiting and preemptions 7 %; 4 preemptions, KV at most")


def test_prefill_decode_interference(tmp_path):
    d = run_of(tmp_path, **interference_run())
    assert d["label"] == "prefill-decode interference", d["clue"]
    assert d["interference_ratio"] == pytest.approx(1.5 / 0.05)
    assert d["clue"] == ("8 requests arriving during long prefills: TTFT p90 30.0x that of the other 36 "
                         "(gauges and client times: no per-request server timings, long prefills counted from "
                         "their send)")
    # the same probes unaffected: no interference; nothing queued, and the long prompts' own
    # 2 s prefills miss the 1 s TTFT objective: the steps themselves, prefill
    d = run_of(tmp_path, **interference_run("int2", probe_ttft=0.05))
    assert d["label"] == "compute-bound" and "the steps were too slow, prefill" in d["clue"], d["clue"]
    d = run_of(tmp_path, DiagnosisRules(slo_ttft_ms=4000), **interference_run("int3", probe_ttft=0.05))
    assert d["label"] == "reference", d["clue"]


def test_failed_run(tmp_path):
    d = run_of(tmp_path, run_id="bad", status="failed", error="vLLM exited during start-up\nTraceback ...",
               requests=[], samples=[])
    assert d["label"] == "failed" and d["clue"] == "vLLM exited during start-up"
    assert d["failed_share"] is None and d["littles_ok"]


def test_the_cap_is_what_held_the_waiting_whatever_its_share_of_the_time(tmp_path):
    reqs = queue(every(0.1, 201), 0.5, 64)  # loaded window: 2.0 to 20.0 s, nine periods of 2 s
    # at the cap 45 % of the time; 5 wait from then on, through 0.3 s of each period more with slots free
    samples = series(21, lambda t: 64 if (t - 2) % 2 < 0.875 else 30, lambda t: 5 if (t - 2) % 2 < 1.175 else 0,
                     lambda t: 10, dt=0.05)
    d = run_of(tmp_path, run_id="b45", requests=reqs, samples=samples)
    assert d["running_at_cap_share"] == pytest.approx(0.45) and d["waiting_share"] == pytest.approx(0.6)
    assert d["label"] == "active-sequence limit", d["clue"]
    assert d["bound"] == "cap 75 %, compute 25 %" and d["then_filled"] == "compute-bound (25 % of the waiting)"


def test_kv_full_while_at_the_cap_is_the_cap_the_scheduler_checks_first(tmp_path):
    reqs = queue(every(0.1, 200), 0.5, 64)
    d = run_of(tmp_path, run_id="both", requests=reqs, samples=series(21, lambda t: 64, lambda t: 9, lambda t: 95))
    assert d["kv_full_share"] == 1 and d["running_at_cap_share"] == 1
    # no request is admitted past a full running set, whatever the blocks: the cap held them
    assert d["label"] == "active-sequence limit", d["clue"]
    assert d["bound"] == "cap 100 %" and d["then_filled"] is None


def test_client_limited_and_errors_are_warned(tmp_path):
    run = reference_run("lagged")
    for r in run["requests"][::10]:
        r["t_sent"] = r["t_scheduled"] + 0.2  # the client sent late
    run["requests"][5]["status"] = "timeout"
    d = run_of(tmp_path, **run)
    assert d["label"] == "reference"
    assert d["warnings"] == "client-limited (dispatch lag p99 200 ms > 50 ms)"
    d = run_of(tmp_path, DiagnosisRules(max_failed_share=0.001), **run | {"run_id": "lagged2"})
    assert "errors (0 % of sent requests failed)" in d["warnings"] and d["failed_share"] == 1 / 200


def md1_run(run_id, scale=1.0):
    rng = random.Random(7)
    arrivals = [0.0]
    while len(arrivals) < 400:
        arrivals.append(arrivals[-1] + rng.expovariate(4.0))  # Poisson, 4/s, 0.15 s each: load 0.6
    reqs = queue(arrivals, 0.15, 1, ttft_s=0.01)
    return {"run_id": run_id, "requests": reqs, "samples": gauges(reqs, arrivals[-1] + 1, lambda n: n, scale=scale)}


def test_littles_law_holds_and_a_miscount_is_flagged(tmp_path):
    d = run_of(tmp_path, **md1_run("md1"))
    assert d["littles_ok"] and 0.9 < d["littles_ratio"] < 1.1, d
    assert d["littles_lambda_W"] == pytest.approx(d["littles_L_server"], rel=0.1)
    d = run_of(tmp_path, **md1_run("md1x2", scale=2.0))
    assert not d["littles_ok"] and 1.8 < d["littles_ratio"] < 2.2
    assert "Little's law mismatch (L " in d["warnings"]


def test_littles_law_is_skipped_for_closed_loops_and_few_arrivals(tmp_path):
    run = reference_run("closed") | {"meta": {"spec": {"loadgen": {"mode": "closed", "concurrency": 8}}}}
    d = run_of(tmp_path, **run)
    assert d["littles_ratio"] is None and d["littles_ok"] and "Little's law not checked: closed loop" in d["notes"]
    d = run_of(tmp_path, **reference_run("few") | {"requests": reference_run()["requests"][:15]})
    assert d["littles_ratio"] is None and "Little's law not checked: 13 arrivals in the window" in d["notes"]


def test_unknown_cap_gives_no_at_cap_signal(tmp_path):
    # nothing queued: nothing held, whatever the cap
    d = run_of(tmp_path, **reference_run("nocap") | {"cap": None})
    assert d["running_at_cap_share"] is None and d["cap"] is None and d["label"] == "reference"
    assert "max_num_seqs unknown: the cap not tested" in d["clue"]
    assert "cap unknown" in d["first_crossings"]
    # the other limits are still tested, and the clue says the cap was not
    d = run_of(tmp_path, **kv_pressure_run("kvnocap") | {"cap": None})
    assert d["label"] == "KV-capacity pressure", d["clue"]
    assert "max_num_seqs unknown: the cap not tested" in d["clue"]
    # the cap from the run's settings, then from the rules
    meta = {"server": {"settings": {"max_num_seqs": 16}}}
    assert run_of(tmp_path, **reference_run("meta") | {"cap": None, "meta": meta})["cap"] == 16
    assert run_of(tmp_path, DiagnosisRules(default_cap=32), **reference_run("rule") | {"cap": None})["cap"] == 32


def test_goodput_counts_ttft_and_each_requests_itl(tmp_path):
    reqs = [request(i, float(i), i + 0.1, i + 1.0) for i in range(4)]
    reqs[1]["t_first_token"] = 1 + 1.5  # TTFT 1.5 s: misses the 1 s objective
    reqs[3]["status"] = "http_error"
    tokens = {0: [0.1, 0.2, 0.3], 1: [2.5, 2.6], 2: [2.1, 2.2, 2.9]}  # request 2: a 700 ms gap
    d = run_of(tmp_path, run_id="slo", requests=reqs, tokens=tokens, samples=[])
    # 4 arrivals 1 s apart offer 1 req/s; a quarter of them met the objective
    assert d["slo_met_share"] == 0.25 and d["goodput_rps"] == pytest.approx(0.25)


def test_goodput_sees_a_stall_delivered_as_one_chunk(tmp_path):
    reqs = [request(i, float(i), i + 0.1, i + 6.0) for i in range(2)]
    tokens = {0: [0.1, 0.2, 0.3], 1: [(1.1, 1), (6.1, 50)]}  # 5 s without a token, then 50 at once
    d = run_of(tmp_path, run_id="stall", requests=reqs, tokens=tokens, samples=[])
    assert d["slo_met_share"] == 0.5


def test_itl_merges_chunks_of_one_read_and_keeps_both_conventions(tmp_path):
    reqs = [request(0, 0.0, 0.1, 0.4)]
    tokens = {0: [0.1, 0.2, 0.2, 0.2, 0.3]}  # three chunks read at one instant
    db = make_db(tmp_path / "itl.duckdb", [{"run_id": "itl", "requests": reqs, "samples": [], "tokens": tokens}])
    with duckdb.connect(str(db), read_only=True) as con:
        s = signals.run_summary(con).to_dicts()[0]
    # chunks (0.1, 1), (0.2, 3), (0.3, 1): per token 100/3 and 100 ms; per chunk 100 and 100 ms
    assert s["itl_p50_ms"] == pytest.approx((100 / 3 + 100) / 2)
    assert s["itl_chunk_p50_ms"] == pytest.approx(100) and s["itl_chunk_p99_ms"] == pytest.approx(100)


def test_goodput_and_offered_load_share_one_denominator(tmp_path):
    run = reference_run("allmet")
    db = make_db(tmp_path / "allmet.duckdb", [run])
    with duckdb.connect(str(db), read_only=True) as con:
        d = diagnose(con, DiagnosisRules()).to_dicts()[0]
        rates = signals.run_rates(con).to_dicts()[0]
    assert d["slo_met_share"] == 1.0 and d["goodput_rps"] == pytest.approx(rates["offered_rps"])


def test_offered_load_goodput_and_sent_rate_count_the_gaps_between_arrivals(tmp_path):
    """n arrivals span n - 1 gaps: ten arrivals 1 s apart offer 1 req/s, not 10 / 9. The
    same estimator for the offered load, the goodput and the rate the client sent at."""
    from filledfirst.rates import arrival_rate_sql

    reqs = [request(i, float(i), i + 0.1, i + 0.5) for i in range(10)]
    lone = [request(0, 0.0, 0.1, 0.5)]
    db = make_db(tmp_path / "gaps.duckdb", [{"run_id": "ten", "requests": reqs, "samples": []},
                                            {"run_id": "lone", "requests": lone, "samples": []}])
    with duckdb.connect(str(db), read_only=True) as con:
        rates = {r["run_id"]: r for r in signals.run_rates(con).to_dicts()}
        diag = {r["run_id"]: r for r in diagnose(con, DiagnosisRules()).to_dicts()}
        sent = dict(con.execute(f"SELECT run_id, {arrival_rate_sql('t_sent')} FROM requests GROUP BY run_id"
                                ).fetchall())
    assert rates["ten"]["offered_rps"] == pytest.approx(1.0) and rates["ten"]["arrival_span_s"] == 9.0
    assert diag["ten"]["slo_met_share"] == 1.0 and diag["ten"]["goodput_rps"] == pytest.approx(1.0)
    assert sent["ten"] == pytest.approx(1.0)
    # one arrival has no rate
    assert rates["lone"]["offered_rps"] is None and diag["lone"]["goodput_rps"] is None and sent["lone"] is None


def test_the_schedule_and_the_trace_state_the_same_rate():
    from filledfirst.rates import arrival_rate
    from filledfirst.schedule import schedule_stats

    ten = pl.DataFrame({"t_offset_s": [float(i) for i in range(10)], "prompt_tokens": [1] * 10,
                        "output_tokens": [1] * 10, "role": ["r"] * 10})
    assert schedule_stats(ten).mean_rate_per_s == pytest.approx(1.0)
    # a trace window's length is not an arrival span: n arrivals in a 20 s window offer n / 20
    assert schedule_stats(ten, duration_s=20.0).mean_rate_per_s == pytest.approx(0.5)
    assert arrival_rate(10, 9.0) == 1.0 and arrival_rate(1, 0.0) is None and arrival_rate(0, 0.0) is None


def test_run_rates(tmp_path):
    reqs = [request(i, 0.5 * i, 0.5 * i + 0.1, 0.5 * i + 1.1) | {"t_last_token": 0.5 * i + 1.1,
                                                                 "output_tokens_received": 11} for i in range(5)]
    reqs[4].update(status="not_sent", t_sent=None, t_first_token=None, t_done=None, t_last_token=None,
                   output_tokens_received=None)
    reqs[3].update(status="timeout", t_first_token=None, t_last_token=None, output_tokens_received=None)
    db = make_db(tmp_path / "rates.duckdb", [{"run_id": "rates", "requests": reqs, "samples": []}])
    with duckdb.connect(str(db), read_only=True) as con:
        r = signals.run_rates(con).to_dicts()[0]
    assert r["n_failed"] == 1 and r["offered_rps"] == pytest.approx(2.0)  # the sent ones: 4 arrivals 0.5 s apart
    assert r["tok_s_per_request"] == pytest.approx(10.0) and r["ttft_p50_ms"] == pytest.approx(100)
    assert r["total_tok_s"] == pytest.approx(33 / (2.6 - 0.0))  # first send to last answer


def test_kv_ledger(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    shape = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 128,
             "torch_dtype": "bfloat16"}
    (model / "config.json").write_text(json.dumps(shape))
    meta = {"model": {"path": str(model), "dtype": "auto"}}
    run = reference_run("ledger") | {"meta": meta | {"kv": kv_record(meta["model"])}}
    run["samples"] = run["samples"] + [(0.0, "vllm:cache_config_info", 1)]
    run["labels"] = {"vllm:cache_config_info": "block_size=16,cache_dtype=auto,engine=0,num_gpu_blocks=100,"
                                               "num_gpu_blocks_override=None"}
    d = run_of(tmp_path, **run)
    assert d["kv_bytes_per_token"] == 2 * 2 * 2 * 32 * 2 and d["kv_capacity_tokens"] == 1600
    assert d["kv_fit_concurrency"] == pytest.approx(1600 / 250)
    nowhere = {"path": str(tmp_path / "nowhere")}
    d = run_of(tmp_path, **reference_run("noledger") | {"meta": {"model": nowhere, "kv": kv_record(nowhere)}})
    assert d["kv_bytes_per_token"] is None and d["kv_capacity_tokens"] is None
    assert "KV bytes per token not known (no local model config.json)" in d["notes"]
    # a run.json from before runs recorded the KV shape: the diagnosis reads no model folder
    d = run_of(tmp_path, **reference_run("older") | {"meta": {"model": {"path": str(model), "dtype": "auto"}}})
    assert d["kv_bytes_per_token"] is None and "recorded no KV shape" in d["notes"]


def test_rules_from_config_override_the_defaults():
    assert DiagnosisRules.from_config(None) == DiagnosisRules()
    assert DiagnosisRules.from_config({"slo_ttft_ms": 500}).slo_ttft_ms == 500
    with pytest.raises(UserError, match="bogus"):
        DiagnosisRules.from_config({"bogus": 1})


def test_diagnose_from_an_ingested_copy(tmp_path):
    """The workflow's `diagnose` rule: the ingested file stays as it was, the labelled copy
    appears whole or not at all."""
    src = make_db(tmp_path / "ingested.duckdb", [reference_run(), kv_pressure_run()])
    before = src.read_bytes()
    out = tmp_path / "filledfirst.duckdb"
    assert main(["diagnose", "--from", str(src), "--db", str(out)]) == 0
    assert src.read_bytes() == before
    with duckdb.connect(str(out), read_only=True) as con:
        assert dict(con.execute("SELECT run_id, label FROM diagnosis").fetchall()) == {
            "ref": "reference", "kv": "KV-capacity pressure"}
        assert con.execute("SELECT count(*) FROM frontiers").fetchone()[0] == 0
    labelled = out.read_bytes()
    assert main(["diagnose", "--from", str(tmp_path / "nowhere.duckdb"), "--db", str(out)]) == 2
    assert out.read_bytes() == labelled and not list(tmp_path.glob(".*partial*"))


def test_write_diagnosis_and_cli(tmp_path, capsys):
    db = make_db(tmp_path / "f.duckdb", [reference_run(), kv_pressure_run(), interference_run()])
    write_diagnosis(db, DiagnosisRules())
    assert main(["diagnose", "--db", str(db)]) == 0  # again: the table is replaced
    with duckdb.connect(str(db), read_only=True) as con:
        labels = dict(con.execute("SELECT run_id, label FROM diagnosis").fetchall())
    assert labels == {"ref": "reference", "kv": "KV-capacity pressure", "int": "prefill-decode interference"}
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ref: reference - nothing queued (waiting 0 % of the time)") and len(out) == 3
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]
    with pytest.raises(UserError, match="no such database"):
        write_diagnosis(tmp_path / "missing.duckdb", DiagnosisRules())


def cut_short_run(run_id="cut"):
    """The server died at 8 s of a 20 s schedule: 80 requests answered, 20 sent into the
    dead server, 100 never sent; the scrapes end with the server."""
    reqs = queue(every(0.1, 200), 0.5, 64)
    samples = [s for s in gauges(reqs[:80], 8, lambda n: 0.5 * n)]
    for r in reqs[80:100]:
        r.update(status="disconnected", t_first_token=None, t_done=max(r["t_scheduled"], 8.0) + 0.01)
    for r in reqs[100:]:
        r.update(status="not_sent", t_sent=None, t_first_token=None, t_done=None)
    return {"run_id": run_id, "status": "partial", "requests": reqs, "samples": samples}


def test_never_sent_requests_are_not_failures(tmp_path):
    d = run_of(tmp_path, **cut_short_run())
    assert d["failed_share"] == pytest.approx(20 / 100)
    assert "partial run (100 of 200 requests never sent)" in d["warnings"]
    assert "errors (20 % of sent requests failed)" in d["warnings"]
    with duckdb.connect(str(tmp_path / "cut.duckdb"), read_only=True) as con:
        s = signals.run_summary(con).to_dicts()[0]
        rates = signals.run_rates(con).to_dicts()[0]
    assert (s["n_requests"], s["n_ok"], s["n_failed"], s["n_not_sent"]) == (200, 80, 20, 100)
    assert rates["n_failed"] == 20


def test_a_cut_short_run_is_judged_over_what_was_measured(tmp_path):
    d = run_of(tmp_path, **cut_short_run())
    # arrivals of sent requests only (0 to 9.9 s), clipped to the last scrape at 8 s
    assert d["window_start_s"] == pytest.approx(0.99) and d["window_end_s"] == pytest.approx(8.0)
    assert d["label"] == "reference", d["clue"]
    assert d["littles_ok"] and 0.9 < d["littles_ratio"] < 1.1, d


SCRAPE_ERROR = "filledfirst:scrape_error"


def gap_run(run_id, gap, errors):
    """The reference run whose scrapes in `gap` failed (error samples if `errors`, else
    nothing); the last good one before it caught a burst: 64 running, 9 waiting."""
    run = reference_run(run_id)
    lo, hi = gap
    samples = [(t, m, v) for t, m, v in run["samples"] if not lo < t < hi]
    samples = [(t, m, {RUNNING: 64, WAITING: 9}.get(m, v) if t == lo else v) for t, m, v in samples]
    if errors:
        samples += [(t, SCRAPE_ERROR, 1) for t in every(0.25, int((hi - lo) / 0.25) - 1, lo + 0.25)]
    return run | {"samples": samples}


def test_a_scrape_gap_is_not_filled_with_the_last_value(tmp_path):
    # held over the 2 s gap, 9 waiting would be 11 % of the loaded time: no reference
    d = run_of(tmp_path, **gap_run("errs", (8.0, 10.0), errors=True))
    assert d["label"] == "reference", d["clue"]
    assert d["waiting_share"] == pytest.approx(0.25 / (17.91 - 1.75), rel=0.01)  # ends at the failed scrape
    assert d["scrape_coverage"] == pytest.approx((17.91 - 1.75) / 17.91, rel=0.01)
    d = run_of(tmp_path, **gap_run("quiet", (8.0, 10.0), errors=False))
    assert d["label"] == "reference", d["clue"]
    assert d["waiting_share"] == pytest.approx(0.5 / (17.91 - 1.5), rel=0.01)  # held 2 x the interval


def test_low_scrape_coverage_gives_no_label(tmp_path):
    d = run_of(tmp_path, **gap_run("holes", (4.0, 16.0), errors=True))
    assert d["scrape_coverage"] < 0.5
    assert d["label"] == "unclassified" and d["clue"].startswith("scrapes cover only 3"), d["clue"]
    assert "of the loaded window (needs >= 80 %)" in d["clue"]


def test_a_short_window_needs_enough_scrapes(tmp_path):
    reqs = queue(every(0.05, 10), 0.3, 64)  # arrivals over 0.45 s: one scrape inside the window
    d = run_of(tmp_path, run_id="blip", requests=reqs, samples=gauges(reqs, 2, lambda n: n))
    assert d["label"] == "unclassified" and d["clue"] == "1 scrape in the loaded window (needs >= 4)", d["clue"]


TTFT_HIST = "vllm:time_to_first_token_seconds"


def hist_db(tmp_path, name, scrapes):
    """scrapes: [(t, engine, {le: cumulative count})]: one histogram, stored as scraped."""
    db = tmp_path / f"{name}.duckdb"
    con = duckdb.connect(str(db))
    con.execute(DDL)
    con.execute("INSERT INTO runs (run_id, experiment, status) VALUES (?, ?, 'ok')", [name, name])
    for t, engine, buckets in scrapes:
        for le, count in buckets.items():
            con.execute("INSERT INTO samples VALUES (?, ?, ?, ?, ?)",
                        [name, t, TTFT_HIST + "_bucket", f"engine={engine},le={le}", float(count)])
    con.close()
    return duckdb.connect(str(db), read_only=True)


def quantile(con, q):
    return signals.histogram_quantile(con, (TTFT_HIST,), q).to_dicts()[0]


def test_histogram_quantile_edges(tmp_path):
    first = hist_db(tmp_path, "first", [(0, 0, {"0.1": 0, "1.0": 0, "+Inf": 0}),
                                        (1, 0, {"0.1": 4, "1.0": 4, "+Inf": 4})])
    assert quantile(first, 0.5) == {"run_id": "first", "value": pytest.approx(0.05), "bucket_lo": 0.0,
                                    "bucket_hi": 0.1, "n": 4}
    inf = hist_db(tmp_path, "inf", [(0, 0, {"0.1": 0, "1.0": 0, "+Inf": 0}), (1, 0, {"0.1": 1, "1.0": 1, "+Inf": 4})])
    assert quantile(inf, 0.9)["value"] == 1.0  # above the last finite bound: that bound
    zero = hist_db(tmp_path, "zero", [(0, 0, {"0.1": 3, "+Inf": 3}), (1, 0, {"0.1": 3, "+Inf": 3})])
    assert quantile(zero, 0.5)["value"] is None and quantile(zero, 0.5)["n"] == 0
    two = hist_db(tmp_path, "two", [(0, e, {"0.1": 0, "1.0": 0, "+Inf": 0}) for e in (0, 1)]
                  + [(1, 0, {"0.1": 2, "1.0": 2, "+Inf": 2}), (1, 1, {"0.1": 0, "1.0": 2, "+Inf": 2})])
    assert quantile(two, 0.5)["n"] == 4 and quantile(two, 0.5)["value"] == pytest.approx(0.1)


def test_counter_resets_count_as_prometheus_increase_does(tmp_path):
    # the server restarted at 1.5 s: its counts start again from 0
    reset = hist_db(tmp_path, "reset", [(0, 0, {"0.1": 5, "1.0": 5, "+Inf": 5}),
                                        (1, 0, {"0.1": 9, "1.0": 9, "+Inf": 9}),
                                        (2, 0, {"0.1": 0, "1.0": 2, "+Inf": 2}),
                                        (3, 0, {"0.1": 0, "1.0": 6, "+Inf": 6})])
    # 4 + 6 observations: 4 below 0.1 s, 6 between 0.1 and 1 s
    assert quantile(reset, 0.5) == {"run_id": "reset", "value": pytest.approx(0.1 + 0.9 / 6), "bucket_lo": 0.1,
                                    "bucket_hi": 1.0, "n": 10}
    run = kv_pressure_run("restart")
    samples = [s for s in run["samples"] if s[1] != "vllm:num_preemptions_total"]
    samples += [(t, "vllm:num_preemptions_total", t // 3 if t < 8 else (t - 8) // 3)
                for t, m, _ in samples if m == RUNNING]
    d = run_of(tmp_path, **run | {"samples": samples})
    assert d["window_preemptions"] == 4  # 2 before the restart, 2 after, inside the window
    with duckdb.connect(str(tmp_path / "restart.duckdb"), read_only=True) as con:
        assert signals.run_summary(con)["preemptions"][0] == 2 + 8  # whole run: 0-2, then 0-8


def test_one_slow_request_behind_one_long_prompt_is_no_interference(tmp_path):
    reqs = [request(i, t, t + 0.05, t + 0.5) for i, t in enumerate(every(0.25, 80)) if not 5 <= t <= 8]
    reqs += [request(500, 5.0, 8.0, 8.1, role="long", prompt=4000), request(501, 5.05, 7.05, 7.2, role="probe")]
    d = run_of(tmp_path, run_id="lone", requests=reqs, samples=gauges(reqs, 21, lambda n: n))
    assert d["label"] == "reference", d["clue"]
    assert d["interference_ratio"] is None


def test_a_queue_behind_the_cap_is_no_interference(tmp_path):
    # from 3 to 6 s the server sits at its cap of 8 with a queue: the long prompt sent at
    # 3 s waits in it like everyone else, its "prefill" time is queue time
    reqs = [request(i, t, t + (2.0 if 3 <= t < 6 else 0.05), t + 2.5) for i, t in enumerate(every(0.1, 100))]
    reqs.append(request(100, 3.0, 6.0, 6.1, role="long", prompt=4000))
    samples = series(12, lambda t: 8 if 3 <= t < 6 else 3, lambda t: 10 if 3 <= t < 6 else 0, lambda t: 10)
    d = run_of(tmp_path, run_id="capq", cap=8, requests=reqs, samples=samples)
    assert d["label"] != "prefill-decode interference", d["clue"]
    assert d["interference_ratio"] is None


def test_preemptions_hold_the_queue_at_the_scrapes_they_happen(tmp_path):
    # vLLM preempts only when a running request cannot get a block: the queue waits on KV then
    reqs = queue(every(0.1, 200), 1.2, 8)
    samples = [(t, m, 0.95 if m == KV and 10 <= t < 15 else v) for t, m, v in gauges(reqs, 32, lambda n: 1.5 * n)]
    samples += [(t, "vllm:num_preemptions_total", t // 5) for t, m, _ in samples if m == RUNNING]
    d = run_of(tmp_path, run_id="limkv", cap=8, requests=reqs, samples=samples)
    # the cap held the queue, except at the three scrapes whose interval saw a preemption
    assert d["label"] == "active-sequence limit", d["clue"]
    assert d["bound"].startswith("cap 9") and "preemption" in d["bound"], d["bound"]


def test_the_cap_counts_once_per_engine(tmp_path):
    # two engines of max_num_seqs 8, each running 5: far from 2 x 8
    samples = [(t, m, v, f"engine={e}") for t, m, v in series(21, lambda t: 5, lambda t: 0, lambda t: 10)
               for e in (0, 1)]
    d = run_of(tmp_path, run_id="dp", cap=8, requests=queue(every(0.1, 200), 1.0, 10), samples=samples)
    assert d["window_running_median"] == 10 and d["running_at_cap_share"] == 0
    assert d["label"] == "reference", d["clue"]
    assert d["clue"] == "nothing queued (waiting 0 % of the time), running median 10 of 2 x 8, KV median 10 %"


QWEN2_7B = {"model_type": "qwen2", "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
            "hidden_size": 3584, "torch_dtype": "bfloat16"}
LLAMA3_8B = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "hidden_size": 4096, "head_dim": 128, "torch_dtype": "bfloat16"}
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "num_hidden_layers": 61, "num_attention_heads": 128,
               "num_key_value_heads": 128, "hidden_size": 7168, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
               "qk_nope_head_dim": 128, "v_head_dim": 128, "torch_dtype": "bfloat16"}
QWEN3_NEXT = {"model_type": "qwen3_next", "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2,
              "head_dim": 256, "hidden_size": 2048, "torch_dtype": "bfloat16",
              "layer_types": ["linear_attention"] * 3 + ["full_attention"]}
LLAVA = {"model_type": "llava", "torch_dtype": "float16",  # the dtype outside text_config
         "text_config": {k: v for k, v in LLAMA3_8B.items() if k != "torch_dtype"}}
TINY_FP32 = {"model_type": "qwen2", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "hidden_size": 128, "torch_dtype": "float32"}


@pytest.mark.parametrize("name, config, dtype, cache, expected", [
    ("qwen2", QWEN2_7B, "auto", "", 2 * 28 * 4 * 128 * 2),
    ("llama", LLAMA3_8B, "auto", "", 2 * 32 * 8 * 128 * 2),
    ("mla", DEEPSEEK_V3, "auto", "", (512 + 64) * 61 * 2),  # one latent per layer, not K and V per head
    ("hybrid", QWEN3_NEXT, "auto", "", None),  # linear-attention layers hold a fixed state
    ("text_config", LLAVA, "auto", "", 2 * 32 * 8 * 128 * 2),
    ("fp32_auto", TINY_FP32, "auto", "", None),  # vLLM's choice for float32 depends on the platform
    ("fp32_asked", TINY_FP32, "float32", "", 2 * 2 * 2 * 32 * 4),
    ("fp8", QWEN2_7B, "auto", "cache_dtype=fp8_e4m3,", 2 * 28 * 4 * 128 * 1),
    ("fp8_unknown", QWEN2_7B, "auto", "cache_dtype=fp8_ds_mla,", None),
    ("engine", DEEPSEEK_V3, "auto", "kv_cache_memory_bytes=1000000,kv_cache_size_tokens=4000,", 250),
])
def test_kv_bytes_per_token_by_model_family(tmp_path, name, config, dtype, cache, expected):
    model = tmp_path / name
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    meta = {"model": {"path": str(model), "dtype": dtype}}
    run = reference_run(name) | {"meta": meta | {"kv": kv_record(meta["model"])}}
    info = cache + "block_size=16,engine=0,num_gpu_blocks=250"
    run["samples"] = run["samples"] + [(0.0, "vllm:cache_config_info", 1, info)]
    d = run_of(tmp_path, **run)
    assert d["kv_bytes_per_token"] == expected
    assert d["kv_capacity_tokens"] == (4000 if name == "engine" else 250 * 16)
    if expected is None:
        assert "KV bytes per token not known" in d["notes"]


def test_kv_capacity_adds_up_engines(tmp_path):
    run = reference_run("dp2")
    labels = "block_size=16,engine={e},kv_cache_memory_bytes=800,kv_cache_size_tokens=100,num_gpu_blocks=7"
    run["samples"] = run["samples"] + [(0.0, "vllm:cache_config_info", 1, labels.format(e=e)) for e in (0, 1)]
    d = run_of(tmp_path, **run)
    assert d["kv_capacity_tokens"] == 200 and d["kv_bytes_per_token"] == 8


def test_first_token_timeouts_stand_beside_the_ttft_percentiles(tmp_path):
    run = reference_run("slowfirst")
    for r in run["requests"][10:12]:
        r.update(status="timeout", t_first_token=None)  # no first token in time: not in the percentiles
    run["requests"][20].update(status="timeout")  # the whole request timed out after its first token
    d = run_of(tmp_path, **run)
    assert d["ttft_timeouts"] == 2
    with duckdb.connect(str(tmp_path / "slowfirst.duckdb"), read_only=True) as con:
        assert signals.run_summary(con)["ttft_timeouts"][0] == 2


def test_the_report_states_the_thresholds_the_diagnosis_used(tmp_path):
    from filledfirst.contracts.diagnosis import DiagnosisRow
    from filledfirst.report import patterns

    rules = DiagnosisRules(kv_full_pct=80, warmup_frac=0.25, cap_frac=0.75)
    db = make_db(tmp_path / "th.duckdb", [reference_run()])
    write_diagnosis(db, rules)
    with duckdb.connect(str(db), read_only=True) as con:
        stored = stored_rules(con)
        rows = [DiagnosisRow.from_columns(d) for d in con.sql("SELECT * FROM diagnosis").pl().to_dicts()]
    assert stored == rules
    html = patterns.evidence_table(rows, stored) + patterns.evidence_intro(stored)
    assert "KV &gt;= 80 %" in html and "25 % warm-up" in html and "&gt;= 75 % of max_num_seqs" in html
    assert "90 %" not in html and "10 %" not in html


def test_each_label_means_one_thing_held_on_its_rule():
    """What a label means elsewhere (the knob an intervention relaxes, the number At a glance
    quotes, what would move a knee) is read off the rule that gives it: every label has one,
    and the knobs the interventions relax are those of the two limits and the eviction."""
    from filledfirst.analysis.diagnosis.labels import Label
    from filledfirst.analysis.diagnosis.rules import LABELLED, labelled
    from filledfirst.analysis.frontiers import IMPLICATED, NoQueueLabel, meaning
    from filledfirst.contracts.search import Knob

    assert set(LABELLED) == set(Label) and all(rule.label is label for label, rule in LABELLED.items())
    assert IMPLICATED == {Label.SEQ_LIMIT: Knob.SEQS, Label.KV_PRESSURE: Knob.KV, Label.PREFIX_EVICTION: Knob.KV}
    assert labelled(None) is labelled("no such label") is LABELLED[Label.UNCLASSIFIED]
    assert {meaning(label).moves_the_knee for label in NoQueueLabel} == {"more compute or a smaller batch"}
    assert meaning(Label.REFERENCE).moves_the_knee is None and meaning(Label.FAILED).knob is None


def test_the_typed_rows_have_a_field_per_column():
    """The records the report and the comparison read hold every column of their table."""
    from filledfirst.analysis.diagnosis.storage import SCHEMA as DIAGNOSIS
    from filledfirst.analysis.frontiers import SCHEMA as FRONTIERS
    from filledfirst.contracts.diagnosis import DiagnosisRow
    from filledfirst.contracts.frontiers import FrontierRow

    assert list(DiagnosisRow.__struct_fields__) == list(DIAGNOSIS)
    row = FrontierRow(frontier="f", setting="s", slo_ttft_ms=500.0, slo_itl_ms=100.0, probes=1)
    assert set(row.columns()) == set(FRONTIERS)
    assert FrontierRow.from_columns(row.columns()) == row
