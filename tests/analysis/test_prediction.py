"""Predicted knees (filledfirst.analysis.prediction) against a simulated engine whose step
time and limits are known (helpers.sim_engine, scheduled as vLLM's scheduler is): the
knee the model predicts for the limit that fills first is the simulated one, and relaxing
a limit moves the prediction as it moves the simulation."""

from __future__ import annotations

import json

import duckdb
import msgspec
import numpy as np
import pytest

from filledfirst.analysis import frontiers, prediction
from filledfirst.analysis.diagnosis import write_diagnosis
from filledfirst.analysis.frontiers import write_frontiers
from filledfirst.analysis.prediction import Limit, Limits, Shape
from filledfirst.analysis.step_time import Scope, StepModel
from filledfirst.contracts.frontiers import FrontierRow, Prediction
from filledfirst.contracts.search import Knob, Slo
from filledfirst.study import DiagnosisRules

from helpers.searches import SEQ8_SEARCH, cap_probes
from helpers.sim_engine import Engine, knee
from helpers.sim_engine import run as simulate
from helpers.synthetic_db import make_db, step_counters

LAW = (4.0, 0.05, 0.25)  # ms a step, a token, a sequence
MODEL = StepModel(scope=Scope.ENGINE, setting="", runs="", intervals=0, steps=0.0, base_ms=LAW[0],
                  per_token_ms=LAW[1], per_seq_ms=LAW[2], base_se_ms=None, per_token_se_ms=None,
                  per_seq_se_ms=None, r2=None, itl_ratio=None)
N = 800  # requests a simulated probe


def case(engine: Engine, prompt: int, output: int, ttft_s: float, itl_s: float):
    prompts, outputs = np.full(N, prompt), np.full(N, output)
    shape = Shape(prompts.astype(float), outputs.astype(float))
    found = prediction.knees(MODEL, Limits(engine.cap, engine.kv_tokens, engine.budget), shape,
                             Slo(ttft_s * 1000, itl_s * 1000), 0.95)
    first = min(found, key=found.__getitem__)
    simulated = knee(engine, prompts, outputs, ttft_s, itl_s, 0.95, found[first] / 3, found[first] * 3)
    return first, found, simulated


@pytest.mark.parametrize(("engine", "prompt", "output", "ttft_s", "itl_s", "limit", "within"), [
    # short prompts, long answers, a cap of 8: the cap
    (Engine(LAW, 8, 10**6, 2048), 150, 160, 2.0, 1.0, Limit.CAP, 0.1),
    # the seed's long prompts on a small per-step budget: full steps
    (Engine(LAW, 64, 10**6, 512), 1152, 16, 4.0, 2.0, Limit.BUDGET, 0.1),
    # long prompts in big steps under a tight TTFT: the step time itself
    (Engine(LAW, 64, 10**6, 16384), 2000, 8, 0.5, 1.0, Limit.COMPUTE, 0.1),
    # the ledger of a long context on 1,280 blocks: KV; vLLM preempts (and recomputes) the
    # newest where a running request needs a block none is free for, which the mean model
    # does not count, so the simulated knee is a little lower
    (Engine(LAW, 64, 20480, 2048), 1000, 400, 4.0, 2.0, Limit.KV, 0.15),
], ids=["cap", "budget", "compute", "kv"])
def test_the_first_limit_and_its_knee_are_the_simulated_engines(engine, prompt, output, ttft_s, itl_s, limit,
                                                                within):
    first, found, simulated = case(engine, prompt, output, ttft_s, itl_s)
    assert first is limit, found
    assert simulated == pytest.approx(found[first], rel=within)


def test_relaxing_the_limit_that_filled_moves_the_knee_and_the_other_does_not():
    shape = Shape(np.full(N, 150.0), np.full(N, 160.0))
    slo = Slo(2000, 1000)
    parent = Limits(cap=8, kv_tokens=10**6, budget=2048)
    before = prediction.knee(MODEL, parent, shape, slo, 0.95)
    seqs = prediction.knee(*prediction.changed(Limit.CAP, 2, MODEL, parent), shape, slo, 0.95)
    kv = prediction.knee(*prediction.changed(Limit.KV, 2, MODEL, parent), shape, slo, 0.95)
    assert seqs / before - 1 > 0.3 and kv == pytest.approx(before)
    # and the simulated engine agrees on the doubled cap's knee
    engine = Engine(LAW, 16, 10**6, 2048)
    simulated = knee(engine, np.full(N, 150), np.full(N, 160), 2.0, 1.0, 0.95, seqs / 3, seqs * 3)
    assert simulated == pytest.approx(seqs, rel=0.1)


def test_an_engine_whose_step_grows_with_every_sequence_gains_little_from_a_bigger_cap():
    # the CPU engine's case: each sequence costs as much as the step's base, so past a few
    # sequences the step time, not the cap, sets the rate
    slow = StepModel(**{**{f: getattr(MODEL, f) for f in MODEL.__struct_fields__}, "per_seq_ms": 4.0})
    shape, slo = Shape(np.full(N, 150.0), np.full(N, 160.0)), Slo(2000, 1000)
    limits = Limits(cap=64, kv_tokens=10**6, budget=2048)
    doubled = prediction.knee(*prediction.changed(Limit.CAP, 2, slow, limits), shape, slo, 0.95)
    assert doubled / prediction.knee(slow, limits, shape, slo, 0.95) - 1 < 0.1
    said = prediction.would_take(slow, limits, shape, slo, 0.95, 0.3)
    assert said.startswith("+30 %: no limit alone") and "max_num_seqs (x16" in said


def test_what_it_would_take_names_the_cheapest_knob():
    shape, slo = Shape(np.full(N, 150.0), np.full(N, 160.0)), Slo(2000, 1000)
    said = prediction.would_take(MODEL, Limits(cap=8, kv_tokens=10**6, budget=2048), shape, slo, 0.95, 0.3)
    assert said.startswith("+30 %: max_num_seqs x1.") and "KV tokens (x16: +0 %)" in said


def test_a_data_parallel_server_is_its_engines_side_by_side():
    shape, slo = Shape(np.full(N, 150.0), np.full(N, 160.0)), Slo(2000, 1000)
    one = prediction.knees(MODEL, Limits(8, 10**6, 2048), shape, slo, 0.95)
    two = prediction.knees(MODEL, Limits(8, 10**6, 2048, engines=2), shape, slo, 0.95)
    assert two[Limit.CAP] == pytest.approx(2 * one[Limit.CAP])


def test_a_limit_broken_with_no_load_has_a_knee_of_zero():
    # prompts whose prefill alone takes longer than the TTFT SLO
    found = prediction.knees(MODEL, Limits(64, 10**6, 8192), Shape(np.full(10, 60000.0), np.full(10, 4.0)),
                             Slo(1000, 1000), 0.95)
    assert found[Limit.COMPUTE] == 0.0


def test_table_frontiers_carries_each_searchs_prediction(tmp_path):
    # frontier cap's synthetic probes, their engine steps counted: 4 ms a step and 0.05 a
    # token (3 % noise), the tokens varying with time, so a step time is fitted and the
    # searches predicted
    def steps(t):
        tokens = 50 + 40 * (t % 7)
        ms = (4 + 0.05 * tokens) * (1 + 0.03 * np.sin(7.3 * t))
        return 250 / ms, 250 / ms * tokens

    runs = cap_probes()
    for r in runs:
        r["samples"] = r["samples"] + step_counters(60, steps)
    path = make_db(tmp_path / "p.duckdb", runs)
    with duckdb.connect(str(path)) as con:
        con.execute("INSERT INTO frontier_searches VALUES (?, ?, ?)", ["cap", "seq8", json.dumps(SEQ8_SEARCH)])
    write_diagnosis(path, DiagnosisRules())
    write_frontiers(path)
    with duckdb.connect(str(path), read_only=True) as con:
        rows = {r.setting: r for r in frontiers.frontier_rows(con)}
        scopes = {s for (s,) in con.execute("SELECT DISTINCT scope FROM step_models").fetchall()}
    assert scopes == {"setting", "engine"}
    p = rows["seq8"].prediction
    assert p is not None and p.predicted_cap_rps is not None and p.predicted_rps > 0
    assert p.predicted_first in {limit.value for limit in Limit} and p.would_take.startswith("+30 %")
    assert p.predicted_ratio == pytest.approx((5.657 * 8.0) ** 0.5 / p.predicted_rps)


def test_an_intervention_relaxed_further_than_a_doubling_is_told_what_a_doubling_would_give():
    shape, slo = Shape(np.full(N, 150.0), np.full(N, 160.0)), Slo(2000, 1000)
    parent = prediction.Search(MODEL, Limits(cap=8, kv_tokens=10**6, budget=2048), shape)
    cols = {"frontier": "f", "slo_ttft_ms": 2000.0, "slo_itl_ms": 1000.0, "probes": 1, "target": 0.95}
    rows = [FrontierRow.from_columns({**cols, "setting": "seq8"}),
            FrontierRow.from_columns({**cols, "setting": "seq8_seqs_x4", "parent": "seq8", "knob": "max_num_seqs",
                                      "relaxed_from": 8, "relaxed_to": 32, "paired_concurrency": 32}),
            FrontierRow.from_columns({**cols, "setting": "seq8_kv_x2", "parent": "seq8", "knob": "KV tokens",
                                      "relaxed_from": 1000, "relaxed_to": 2000})]
    x4, kv = (r.intervention for r in frontiers._predicted(rows, {("f", "seq8"): parent})[1:])
    assert x4.predicted_shift == pytest.approx(prediction.shift(parent, Knob.SEQS, 4, slo, 0.95))
    assert x4.predicted_shift_doubled == pytest.approx(prediction.shift(parent, Knob.SEQS, 2, slo, 0.95))
    assert 0 < x4.predicted_shift_doubled < x4.predicted_shift
    assert kv.predicted_shift == pytest.approx(0.0, abs=1e-9) and kv.predicted_shift_doubled is None  # a doubling
    # the paired check's shift predicted where it ran (its closed loop), and not where it did not
    assert x4.predicted_paired_shift == pytest.approx(prediction.paired_shift(parent, Knob.SEQS, 4, 32))
    assert kv.predicted_paired_shift is None


@pytest.mark.parametrize(("engine", "prompt", "output", "concurrency", "within"), [
    (Engine(LAW, 8, 10**6, 2048), 150, 160, 16, 0.1),  # the cap holds 8 of the loop's 16
    (Engine(LAW, 16, 10**6, 2048), 150, 160, 16, 0.1),  # the doubled cap runs them all
    # the KV cache holds about 14 by the ledger; the simulated scheduler admits more and
    # preempts (and recomputes) the newest when one cannot grow, which the mean model does
    # not count: the simulated loop completes less than predicted, never more
    (Engine(LAW, 64, 20480, 2048), 1000, 400, 48, 0.25),
    (Engine(LAW, 64, 81920, 2048), 1000, 400, 48, 0.1),  # four times the cache: all of them
], ids=["cap8", "cap16", "kv", "kv_x4"])
def test_a_closed_loops_completions_a_second_are_the_simulated_engines(engine, prompt, output, concurrency, within):
    # the paired check's quantity: what a closed loop of the same requests completes a second
    prompts, outputs = np.full(N, prompt), np.full(N, output)
    reqs = simulate(engine, 0.0, prompts, outputs, concurrency=concurrency)
    done = sorted(r.finished for r in reqs if r.finished is not None)
    simulated = (len(done) - 1) / (done[-1] - done[0])
    predicted = prediction.throughput(MODEL, Limits(engine.cap, engine.kv_tokens, engine.budget),
                                      Shape(prompts.astype(float), outputs.astype(float)), concurrency)
    assert predicted == pytest.approx(simulated, rel=within)
    assert within == 0.1 or predicted > simulated  # where it preempts, the loop completes less


def test_a_relaxation_the_loop_cannot_use_is_predicted_to_buy_nothing_side_by_side():
    shape = Shape(np.full(N, 150.0), np.full(N, 160.0))
    parent = prediction.Search(MODEL, Limits(cap=8, kv_tokens=10**6, budget=2048), shape)
    assert prediction.paired_shift(parent, Knob.SEQS, 2, 8) == pytest.approx(0.0)  # a loop of 8: no 9th to run
    assert prediction.paired_shift(parent, Knob.SEQS, 2, 16) > 0.3
    assert prediction.paired_shift(parent, Knob.KV, 2, 16) == pytest.approx(0.0)  # the cache was not full


def test_the_context_held_lengthens_every_step_by_its_cost():
    # the cap's knee in closed form: lambda * s * L = cap with s = base / (1 - lambda * K),
    # K carrying each request's context token steps L * (u + output / 2) at its cost
    shape, slo = Shape(np.full(N, 1000.0), np.full(N, 400.0)), Slo(60_000, 60_000)
    limits = Limits(cap=16, kv_tokens=10**9, budget=2048)
    with_context = msgspec.structs.replace(MODEL, per_context_ms=0.5)
    base, L = LAW[0] / 1000, 400.0
    k = (LAW[1] + LAW[2]) / 1000 * L + LAW[1] / 1000 * 1000 + 0.5 / 1e6 * L * (1000 + 200)
    assert prediction.knees(with_context, limits, shape, slo, 0.95)[Limit.CAP] == pytest.approx(
        16 / (base * L + 16 * k), rel=1e-6)
    assert prediction.knee(with_context, limits, shape, slo, 0.95) < prediction.knee(MODEL, limits, shape, slo, 0.95)


def test_what_fills_after_a_relaxation_nothing_measured():
    parent = Prediction(predicted_rps=4.0, predicted_first="cap", predicted_next="kv", predicted_next_rps=6.0)
    # moved +25 %: 5 req/s, below KV's 6: the cap again, at the moved knee
    assert prediction.fills_after(parent, 0.25) == ("cap", 5.0, True)
    # moved +60 %: 6.4 req/s, past KV's 6: KV, at its own knee
    assert prediction.fills_after(parent, 0.6) == ("kv", 6.0, False)
    alone = Prediction(predicted_rps=4.0, predicted_first="cap")
    assert prediction.fills_after(alone, 3.0) == ("cap", 16.0, True)
