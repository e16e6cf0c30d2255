"""The engine's step time fitted from the scrapes (filledfirst.analysis.step_time), on a
simulated engine whose step-time law is known: the fit must find it again."""

from __future__ import annotations

import duckdb
import msgspec
import numpy as np
import pytest

from filledfirst.analysis import step_time
from filledfirst.analysis.diagnosis import write_diagnosis
from filledfirst.contracts import runmeta
from filledfirst.contracts.scheduler import SchedulerState
from filledfirst.study import DiagnosisRules

from helpers.synthetic_db import every, gauges, make_db, queue, step_counters, timed

LAW = (3.0, 0.05, 0.3)  # ms per step, ms per token in it, ms per sequence running


def simulated(run_id, n, rng, seqs=None, noise=0.03, law=LAW, contexts=False):
    """`n` intervals of a simulated engine: steps carrying random tokens and sequences,
    each interval's mean step time the law's, with `noise` of it as random error. With
    `contexts`, each interval's sequences hold contexts of a random length (100 to 3,000
    tokens each, as shapes differ), and a fourth term of the law is its cost per 1,000
    tokens held; else the cache holds the same 100 blocks throughout."""
    out = []
    for k in range(n):
        steps = float(rng.integers(5, 60))
        tokens = float(rng.uniform(1, 2000))
        running = float(seqs if seqs is not None else rng.integers(1, 65))
        used = int(running * rng.uniform(100, 3000) / 16) if contexts else 100
        cost = law[0] + law[1] * tokens + law[2] * running + (law[3] * used * 16 / 1000 if contexts else 0.0)
        out.append(SchedulerState(
            run_id=run_id, t=0.25 * k, engine="0", running=running, waiting=0.0, cap=64, kv_pct=10.0, blocks=10**5,
            blocks_free=10**5 - used, block_size=16, budget=2048, preempted=0.0, steps=steps,
            step_tokens=steps * tokens, prompt_tokens=0.0, step_ms=cost * (1 + noise * rng.standard_normal()),
            head_request=None, head_blocks=None, head_wait_s=None, constraint=None))
    return out


def meta(run_id, experiment, **settings):
    return runmeta.decode({"run_id": run_id, "experiment": experiment, "status": "ok",
                           "server": {"settings": {"max_num_seqs": 64, **settings}}})


def test_the_fit_finds_the_law_of_a_simulated_engine_again():
    rng = np.random.default_rng(0)
    states = simulated("a", 200, rng) + simulated("b", 200, rng)
    # the law's step for each run's mean interval, as a decoding request's gap would show it
    metas = {"a": meta("a", "decode_low"), "b": meta("b", "decode_high")}
    model, engine = step_time.models(states, metas, {"a": None, "b": None})
    # one setting: its engine's fit is the same
    assert (model.scope, engine.scope) == (step_time.Scope.SETTING, step_time.Scope.ENGINE)
    assert engine.base_ms == pytest.approx(model.base_ms) and model.determined
    for got, want in zip((model.base_ms, model.per_token_ms, model.per_seq_ms), LAW):
        assert got == pytest.approx(want, rel=0.1)
    assert model.per_seq_se_ms is not None and model.per_seq_se_ms < 0.1 * LAW[2]
    assert model.r2 > 0.9 and model.intervals == 400 and model.runs == "decode_high, decode_low"
    assert model.step_ms(1000, 10) == pytest.approx(3 + 50 + 3, rel=0.05)
    # the context never varied: no cost of it in the fit
    assert model.per_context_ms is None and model.per_context_se_ms is None


def test_a_context_that_moves_with_the_sequences_is_not_priced_apart():
    # every sequence holds the same 1,600 tokens (one shape): context and running count
    # cannot be told apart, so the fit keeps its three terms
    rng = np.random.default_rng(6)
    states = [msgspec.structs.replace(s, blocks_free=10**5 - int(s.running) * 100)
              for s in simulated("a", 300, rng)]
    model, _ = step_time.models(states, {"a": meta("a", "x")}, {})
    assert model.per_context_ms is None and model.determined
    assert model.per_seq_ms == pytest.approx(LAW[2], rel=0.1)


def test_a_cost_of_the_context_held_is_found_where_contexts_vary_apart_from_the_sequences():
    rng = np.random.default_rng(5)
    law = (3.0, 0.05, 0.3, 0.4)  # + ms per 1,000 tokens held in the KV cache
    model, _ = step_time.models(simulated("a", 400, rng, law=law, contexts=True), {"a": meta("a", "x")}, {})
    assert model.determined and model.per_context_se_ms is not None
    for got, want in zip((model.per_token_ms, model.per_seq_ms, model.per_context_ms), law[1:]):
        assert got == pytest.approx(want, rel=0.1)
    # steps of up to 2,000 tokens with 3 % noise leave a 3 ms base a few tenths of a ms of error
    assert abs(model.base_ms - law[0]) < 3 * model.base_se_ms < 0.5 * law[0]
    assert model.step_ms(1000, 10, 20_000) == pytest.approx(3 + 50 + 3 + 8, rel=0.05)


def test_a_setting_is_a_server_of_its_own_and_the_itl_checks_the_fit():
    rng = np.random.default_rng(1)
    slow = (6.0, 0.1, 0.6)  # a second server setting, twice as slow
    states = simulated("a", 100, rng) + simulated("b", 100, rng, law=slow)
    metas = {"a": meta("a", "x"), "b": meta("b", "y", max_num_batched_tokens=64)}
    a_step = np.mean([s.step_ms for s in states[:100]])
    fitted = step_time.models(states, metas, {"a": a_step, "b": None})
    models = {m.runs: m for m in fitted if m.scope is step_time.Scope.SETTING}
    assert models["x"].per_token_ms == pytest.approx(0.05, rel=0.1)
    assert models["y"].per_token_ms == pytest.approx(0.1, rel=0.1)
    assert models["x"].itl_ratio == pytest.approx(1.0, rel=0.1) and models["y"].itl_ratio is None


def test_terms_the_intervals_do_not_separate_have_no_standard_error():
    # a cap of 2 always full: the sequences never vary, so they cannot be told from the base
    rng = np.random.default_rng(2)
    model, _ = step_time.models(simulated("a", 50, rng, seqs=2), {"a": meta("a", "seq_limit")}, {})
    assert model.base_se_ms is None and model.per_seq_se_ms is None and not model.determined
    assert model.step_ms(500, 2) == pytest.approx(3 + 25 + 0.6, rel=0.1)  # the fit still predicts what it saw
    # too few intervals: no model
    assert step_time.models(simulated("a", 5, rng), {"a": meta("a", "short")}, {}) == []


def test_the_diagnosis_stores_a_model_per_setting(tmp_path):
    reqs = [timed(r) for r in queue(every(0.05, 400), 0.5, 64)]
    samples = gauges(reqs, 21, lambda n: n) + step_counters(21, lambda t: (25, 25 * (40 + 4 * t)))
    path = make_db(tmp_path / "s.duckdb", [{"run_id": "r", "requests": reqs, "samples": samples}])
    write_diagnosis(path, DiagnosisRules())
    with duckdb.connect(str(path), read_only=True) as con:
        rows = con.sql("SELECT runs, intervals, base_ms, itl_ratio FROM step_models WHERE scope = 'setting'"
                       ).fetchall()
    assert len(rows) == 1 and rows[0][0] == "r" and rows[0][1] >= step_time.MIN_INTERVALS


def test_settings_of_one_engine_share_its_fit():
    # a cap of 2 always full cannot separate its terms; the engine's fit over it and a
    # setting whose sequences varied can, and the settings' limits do not change the law
    rng = np.random.default_rng(3)
    states = simulated("a", 60, rng, seqs=2) + simulated("b", 150, rng)
    metas = {"a": meta("a", "seq2", max_num_seqs=2), "b": meta("b", "default")}
    fitted = step_time.models(states, metas, {})
    (engine,) = [m for m in fitted if m.scope is step_time.Scope.ENGINE]
    assert engine.runs == "default, seq2" and engine.intervals == 210 and engine.determined
    for got, want in zip((engine.base_ms, engine.per_token_ms, engine.per_seq_ms), LAW):
        assert got == pytest.approx(want, rel=0.1)
