"""Interventions: the settings a verified setting derives, the KV budget in tokens, and the
verdict table `frontiers` gives from the knees before and after."""

from __future__ import annotations

import copy
import math

import pytest

from filledfirst.analysis.diagnosis.labels import Label
from filledfirst.analysis.frontiers import (
    Confirmation,
    Role,
    _interventions,
    confirmation,
    knee_span,
    moved,
)
from filledfirst.config import load_config, search_fingerprint, validate_config
from filledfirst.contracts.frontiers import FrontierRow
from filledfirst.contracts.search import Knob, SearchBounds, StopReason
from filledfirst.engine.command import build_command
from filledfirst.errors import UserError
from filledfirst.frontier.interventions import Move, Span, decided, move, widened
from filledfirst.frontier.plan import frontier_plan
from filledfirst.frontier.search import CapacitySearch
from filledfirst.model.kv import kv_blocks
from filledfirst.study import Study, as_study

from conftest import REPO
from helpers.queue_server import QueueServer

E2E = REPO / "tests" / "configs" / "e2e.yaml"


@pytest.fixture
def cfg():
    cfg = copy.deepcopy(load_config([E2E]))
    cfg["workloads"]["light"]["phases"][0]["interval_s"] = 0.5
    cfg["frontiers"] = {"capacity": {
        "workload": "light", "slo": {"ttft_ms": 1000, "itl_ms": 200}, "start": 1, "maximum": 64,
        "settings": {"default": {}, "seq8": {"max_num_seqs": 8, "kv_tokens": 40960},
                     "kv160": {"num_gpu_blocks_override": 160}},
        "interventions": {"settings": ["seq8", "kv160"]}}}
    return cfg


def test_each_verified_setting_gets_its_cap_and_its_kv_budget_doubled(cfg):
    validate_config(cfg)
    plan = frontier_plan(Study.from_dict(cfg), "capacity")
    engine = cfg["engine"]["server"]
    assert list(plan.settings) == ["default", "seq8", "kv160", "seq8_seqs_x2", "seq8_kv_x2",
                                   "kv160_seqs_x2", "kv160_kv_x2"]
    assert plan.settings["seq8_seqs_x2"] == {**engine, "max_num_seqs": 16, "kv_tokens": 40960}
    assert plan.settings["seq8_kv_x2"] == {**engine, "max_num_seqs": 8, "kv_tokens": 81920}
    assert plan.settings["kv160_seqs_x2"] == {**engine, "num_gpu_blocks_override": 160, "max_num_seqs": 128}
    assert plan.settings["kv160_kv_x2"] == {**engine, "num_gpu_blocks_override": 320}
    # the ledger's units: 160 CPU blocks of 128 tokens
    kv = plan.interventions["kv160_kv_x2"]
    assert (kv.parent, kv.knob, kv.before, kv.after, kv.min_shift) == ("kv160", Knob.KV, 20480, 40960, 0.3)
    seqs = plan.interventions["seq8_seqs_x2"]
    assert (seqs.parent, seqs.knob, seqs.before, seqs.after) == ("seq8", Knob.SEQS, 8, 16)
    # an intervention starts from its parent's knee, not from an estimate of its own
    assert plan.estimate_concurrency("seq8") == 8 and plan.estimate_concurrency("seq8_seqs_x2") is None
    # each is its own search, with its own identity
    prints = {s: search_fingerprint(as_study(cfg), "capacity", s) for s in plan.settings}
    assert len(set(prints.values())) == len(prints)
    # judged side by side alone, the same searches: whether one is searched is its job's to know
    cfg["frontiers"]["capacity"]["interventions"].update(paired=True, search=False)
    validate_config(cfg)
    assert not frontier_plan(Study.from_dict(cfg), "capacity").interventions["seq8_seqs_x2"].search
    assert {s: search_fingerprint(as_study(cfg), "capacity", s) for s in plan.settings} == prints


def test_a_factor_relaxes_both_limits_as_far_and_names_them_so(cfg):
    cfg["frontiers"]["capacity"]["interventions"] = {"settings": ["kv160"], "factor": 4}
    validate_config(cfg)
    plan = frontier_plan(Study.from_dict(cfg), "capacity")
    engine = cfg["engine"]["server"]
    assert list(plan.settings)[3:] == ["kv160_seqs_x4", "kv160_kv_x4"]
    assert plan.settings["kv160_kv_x4"] == {**engine, "num_gpu_blocks_override": 640}
    assert plan.settings["kv160_seqs_x4"]["max_num_seqs"] == 4 * engine["max_num_seqs"]
    kv = plan.interventions["kv160_kv_x4"]
    assert (kv.before, kv.after) == (20480, 81920)
    cfg["frontiers"]["capacity"]["interventions"]["factor"] = 1
    with pytest.raises(UserError, match="interventions.factor"):
        validate_config(cfg)


def test_settings_true_tests_every_setting_and_false_none(cfg):
    f = cfg["frontiers"]["capacity"]
    f["settings"]["default"] = {"kv_tokens": 150000}
    f["interventions"] = {"settings": True}
    validate_config(cfg)
    assert len(frontier_plan(Study.from_dict(cfg), "capacity").interventions) == 6
    f["interventions"] = {"settings": False}
    validate_config(cfg)
    assert frontier_plan(Study.from_dict(cfg), "capacity").interventions == {}


@pytest.mark.parametrize("mutate, expected", [
    (lambda f: f.update(interventions={"settings": ["nope"]}),
     "frontiers.capacity.interventions.settings: 'nope' is not one of its settings"),
    (lambda f: f.update(interventions={"settings": ["seq8"], "search": False}),
     "frontiers.capacity.interventions: search: false leaves nothing to judge an intervention by"),
    (lambda f: f.update(interventions={"settings": ["default"]}),
     "frontiers.capacity.interventions: setting 'default': state its KV budget (kv_tokens) to relax it"),
    # vLLM would not start: its KV must hold one request of max_model_len, beside a block it keeps
    (lambda f: f["settings"]["seq8"].update(kv_tokens=1024),
     "frontiers.capacity.settings.seq8: 8 KV blocks of 128 tokens cannot hold one request of max_model_len"),
    (lambda f: f["settings"]["seq8"].update(num_gpu_blocks_override=10),
     "frontiers.capacity.settings.seq8: kv_tokens and num_gpu_blocks_override both set the KV budget"),
    (lambda f: f["settings"].update(seq8_seqs_x2={}),
     "frontiers.capacity.settings: 'seq8_seqs_x2' is the name of an intervention of 'seq8': rename it"),
])
def test_what_cannot_be_verified_is_refused(cfg, mutate, expected):
    mutate(cfg["frontiers"]["capacity"])
    with pytest.raises(UserError) as err:
        validate_config(cfg)
    assert expected in str(err.value)


def test_the_kv_budget_in_tokens_becomes_the_engine_block_count():
    assert kv_blocks("cpu", {"kv_tokens": 20480}) == 160  # 128-token blocks
    assert kv_blocks("gpu", {"kv_tokens": 20480}) == 1280  # 16-token blocks
    assert kv_blocks("gpu", {"kv_tokens": 20481, "block_size": 32}) == 641  # rounded up
    assert kv_blocks("cpu", {"num_gpu_blocks_override": 7}) == 7 and kv_blocks("cpu", {}) is None
    with pytest.raises(ValueError, match="both set the KV budget"):
        kv_blocks("cpu", {"kv_tokens": 1, "num_gpu_blocks_override": 1})
    model = Study.from_dict(load_config([E2E])).model
    argv = build_command(launcher="cpu", model=model, settings={"kv_tokens": 40960}, host="h", port=1, seed=0,
                         extra_env={}, per_request_metrics=False).argv
    assert argv[argv.index("--num-gpu-blocks-override") + 1] == "320" and "kv_tokens" not in " ".join(argv)


def row(setting, lo, hi, floor=None, label=None, parent=None, knob=None, reason="converged", **columns):
    return FrontierRow.from_columns({
        "frontier": "f", "setting": setting, "slo_ttft_ms": 500.0, "slo_itl_ms": 100.0, "probes": 1, "lo_rps": lo,
        "hi_rps": hi, "floor_rps": floor, "knee_label": label, "parent": parent, "knob": knob, "reason": reason,
        **columns})


def table(rows):
    """The rows with their interventions compared, as table `frontiers` stores them, by setting."""
    return {r.setting: r.columns() for r in _interventions(rows)}


def test_a_knee_moves_only_beyond_both_intervals():
    before = row("seq8", 10, 11, floor=9.5)
    assert knee_span(before) == (9.5, 11)
    assert moved(before, row("x", 20, 22, floor=18)) == "up"
    assert moved(before, row("x", 11, 12, floor=10.5)) == "no"  # overlaps: noise
    assert moved(before, row("x", 4, 5, floor=3.8)) == "down"
    assert moved(before, row("x", 64, None, floor=60)) == "up"  # held at maximum
    assert knee_span(row("x", None, 1)) == (0.0, 1)  # broke at start
    assert moved(before, row("x", 3, 4, reason="probe_failed")) is None
    assert knee_span(row("x", 5, None)) == (5, math.inf)
    # beyond the intervals, but by less than the least shift that counts: noise between searches
    assert moved(before, row("x", 12, 13, floor=11.2), min_shift=0.3) == "no"
    assert moved(before, row("x", 13, 14, floor=11.2), min_shift=0.3) == "up"
    assert moved(before, row("x", 7.6, 8, floor=7), min_shift=0.3) == "down"
    assert moved(before, row("x", 8, 9, floor=7), min_shift=0.3) == "no"


@pytest.mark.parametrize("label, relaxed, control, verdict", [
    (Label.SEQ_LIMIT, "up", "no", Confirmation.CONFIRMED),
    (Label.SEQ_LIMIT, "no", "no", Confirmation.NOT_CONFIRMED),
    (Label.SEQ_LIMIT, "no", "up", Confirmation.NOT_CONFIRMED),
    (Label.KV_PRESSURE, "down", "no", Confirmation.NOT_CONFIRMED),
    (Label.KV_PRESSURE, "up", "up", Confirmation.INCONCLUSIVE),
    (Label.KV_PRESSURE, "up", None, Confirmation.INCONCLUSIVE),
    (Label.KV_PRESSURE, None, "no", Confirmation.INCONCLUSIVE),
    ("compute-bound", "up", "no", None),
])
def test_the_verdict_needs_the_relaxed_knee_to_move_and_the_control_not(label, relaxed, control, verdict):
    got, why = confirmation(label, row("r", 2, 3, parent="p", knob="KV tokens", moved=relaxed),
                            row("c", 2, 3, parent="p", knob="max_num_seqs", moved=control))
    assert got == verdict and why


def test_a_move_within_the_parents_drift_is_not_a_move():
    """The parent's search drifted -16 %: the least shift grows from 30 % to 51 %, so a
    control that moved +32 % beyond both intervals did not move, and a relaxed knee that
    moved +40 % is inconclusive rather than a move or a failure to move."""
    assert widened(0.3, -0.16) == pytest.approx(0.508) and widened(0.3, None) == pytest.approx(0.3)

    def study(relaxed_lo, control_lo, drift):
        parent = row("kv160", 2.0, 2.2, floor=1.9, label=Label.KV_PRESSURE, drift=drift)
        return table([parent,
                      row("kv160_kv_x4", relaxed_lo, relaxed_lo * 1.1, floor=relaxed_lo * 0.95,
                          parent="kv160", knob=Knob.KV.value, min_shift=0.3),
                      row("kv160_seqs_x4", control_lo, control_lo * 1.1, floor=control_lo * 0.95,
                          parent="kv160", knob=Knob.SEQS.value, min_shift=0.3)])

    quiet = study(3.12, 2.64, None)  # +56 %, +32 %, no drift measured: the control moved
    assert quiet["kv160_seqs_x4"]["moved"] == "up" and quiet["kv160"]["verdict"] == Confirmation.INCONCLUSIVE
    drifting = study(3.12, 2.64, -0.16)
    control = drifting["kv160_seqs_x4"]
    assert control["least_shift"] == pytest.approx(0.508) and control["moved"] == "no" and control["within_drift"]
    assert drifting["kv160_kv_x4"]["moved"] == "up" and not drifting["kv160_kv_x4"]["within_drift"]
    assert drifting["kv160"]["verdict"] == Confirmation.CONFIRMED
    assert "within the 51 %" in drifting["kv160"]["verdict_why"]
    small = study(2.8, 2.0, -0.16)  # +40 %: beyond 30 %, within 51 %
    assert small["kv160_kv_x4"]["within_drift"] and small["kv160"]["verdict"] == Confirmation.INCONCLUSIVE
    assert "+40 %" in small["kv160"]["verdict_why"]
    none = study(2.1, 2.0, -0.16)  # +5 %: within the intervals whatever the drift
    assert not none["kv160_kv_x4"]["within_drift"] and none["kv160"]["verdict"] == Confirmation.NOT_CONFIRMED
    assert none["kv160"]["verdict_why"] == "relaxing KV tokens moved the knee +5 %, less than the 51 % that counts"


def kv160_study(relaxed_label=Label.SEQ_LIMIT, control=(7.18, 8.97, 6.53)):
    """The shipped demo's reduced-KV knee on a fast VM: the KV budget relaxed 4x moved it
    +25 %, beyond both intervals but by less than the least shift (44 % after the parent's
    -11 % drift), and at the new knee the cap filled first; the control moved it -20 %."""
    lo, hi, floor = control
    return table([row("kv160", 8.97, 9.49, floor=8.16, label=Label.KV_PRESSURE, drift=-0.11),
                  row("kv160_kv_x4", 11.22, 12.54, floor=10.2, label=relaxed_label,
                      parent="kv160", knob=Knob.KV.value, min_shift=0.3),
                  row("kv160_seqs_x4", lo, hi, floor=floor, label=Label.KV_PRESSURE,
                      parent="kv160", knob=Knob.SEQS.value, min_shift=0.3)])


def test_a_knee_that_moved_until_the_next_limit_filled_first_is_confirmed():
    """The move is smaller than the least shift because the next limit (the default cap)
    is close behind: the limit relaxed no longer fills first, the control did not move."""
    by = kv160_study()
    relaxed, parent = by["kv160_kv_x4"], by["kv160"]
    assert relaxed["moved"] == "no" and relaxed["interval_move"] == "up"
    assert by["kv160_seqs_x4"]["interval_move"] == "no"
    assert parent["verdict"] == Confirmation.CONFIRMED and parent["next_label"] == Label.SEQ_LIMIT
    assert parent["verdict_why"] == ("relaxing KV tokens moved the knee +25 %, above its interval, until the "
                                     "active-sequence limit filled first (the next limit close behind: less than "
                                     "the 44 % a move needs otherwise); the control did not move it above its "
                                     "interval")


def test_a_knee_that_moved_too_little_says_what_filled_first_there():
    """The same move with a control that rose above its interval (by less than the least
    shift) is not confirmed, and the why names the next limit rather than saying the knee
    did not move; with the same limit at the new knee it is not confirmed either."""
    parent = kv160_study(control=(10.0, 10.6, 9.6))["kv160"]
    assert parent["verdict"] == Confirmation.NOT_CONFIRMED and parent["next_label"] == Label.SEQ_LIMIT
    assert parent["verdict_why"] == ("relaxing KV tokens moved the knee +25 %, less than the 44 % that counts; "
                                     "at the new knee the active-sequence limit filled first")
    for label in (Label.KV_PRESSURE, "compute-bound", None):
        parent = kv160_study(relaxed_label=label)["kv160"]
        assert parent["verdict"] == Confirmation.NOT_CONFIRMED, label
        assert parent["verdict_why"].startswith("relaxing KV tokens moved the knee +25 %, less than the 44 %")


def test_the_roles_follow_what_filled_first_at_the_parents_knee():
    rows = [row("seq8", 10, 11, floor=9.5, label=Label.SEQ_LIMIT),
            row("seq8_seqs_x2", 20, 22, floor=18, label="compute-bound", parent="seq8", knob=Knob.SEQS.value),
            row("seq8_kv_x2", 10.5, 11, floor=9.8, label=Label.SEQ_LIMIT, parent="seq8", knob=Knob.KV.value),
            row("kv160", 4, 4.4, floor=3.9, label=Label.KV_PRESSURE),
            row("kv160_seqs_x2", 8, 9, floor=7.5, label=Label.KV_PRESSURE, parent="kv160", knob=Knob.SEQS.value),
            row("kv160_kv_x2", 8, 9, floor=7.5, label=Label.SEQ_LIMIT, parent="kv160", knob=Knob.KV.value)]
    by = table(rows)
    assert by["seq8_seqs_x2"]["role"] == Role.RELAXED and by["seq8_kv_x2"]["role"] == Role.CONTROL
    assert by["seq8_seqs_x2"]["moved"] == "up" and by["seq8_seqs_x2"]["shift"] == pytest.approx(1.0)
    assert by["seq8"]["verdict"] == Confirmation.CONFIRMED and by["seq8"]["next_label"] == "compute-bound"
    assert by["kv160_kv_x2"]["role"] == Role.RELAXED and by["kv160_seqs_x2"]["role"] == Role.CONTROL
    # both moved: the knee's label is not what the interventions show
    assert by["kv160"]["verdict"] == Confirmation.INCONCLUSIVE


def test_the_closed_loop_fills_only_what_the_kv_budget_holds(cfg):
    """1,000 in / 400 out is 11 CPU blocks a request: 160 blocks (one kept back) hold 14
    of them, so the estimate's loop runs 14, not the cap of 64 (more would only wait)."""
    cfg["workloads"]["big"] = {"kind": "synthetic", "phases": [
        {"role": "kv_heavy", "count": 10, "interval_s": 0.5, "prompt_tokens": 1000, "output_tokens": 400}]}
    cfg["frontiers"]["capacity"]["workload"] = "big"
    plan = frontier_plan(Study.from_dict(cfg), "capacity")
    assert plan.kv_fit("kv160") == 14 and plan.estimate_concurrency("kv160") == 14
    assert plan.kv_fit("seq8") == 29 and plan.estimate_concurrency("seq8") == 8  # 320 blocks; the cap is less
    assert plan.kv_fit("default") is None and plan.estimate_concurrency("default") == 64  # no budget stated
    assert plan.reference_requests(14) == 114


def test_whether_a_knee_moved_is_decided_before_the_bracket_converges():
    before = Span.of(10.0, 11.0, 9.5)  # held 10, broke 11
    # every rate of [13.5, 20) bisection could still hold stays wholly above 11 and 30 % up
    assert decided(before, 13.5, 20.0, 0.05, 0.3) is Move.UP
    # broke at 12.5: the highest rate held can no longer reach 13 (30 % up), and held 10 is no drop
    assert decided(before, 10.0, 12.5, 0.05, 0.3) is Move.NO
    assert decided(before, 5.0, 7.0, 0.05, 0.3) is Move.DOWN
    assert decided(before, 10.0, 16.0, 0.05, 0.3) is None  # 16 could still hold: not decided
    assert decided(before, 6.0, 10.0, 0.05, 0.3) is None  # could end up down or not
    # a parent that held nothing: only the intervals count
    assert decided(Span.of(None, 1.0, None), 1.2, 2.0, 0.05, 0.3) is Move.UP
    # a parent that never broke cannot be moved above
    assert decided(Span.of(64.0, None, 61.0), 62.0, 70.0, 0.05, 0.3) is Move.NO
    assert move(before, Span.of(14.0, 15.0, 13.3), 0.3) is Move.UP


def parent_knee_on_a_queue(bounds: SearchBounds):
    """A parent's search on a simulated server of 16 slots and 1.9 s lifetimes: its result
    and its knee's span."""
    server = QueueServer(life_s=1.9)
    parent = CapacitySearch(bounds, first=server.closed_loop(3, 1))
    while (rate := parent.next_rate()) is not None:
        parent.record(server.probe(rate, 40.0, len(parent.probes)))
    knee = parent.result()
    return knee, Span.of(knee.lo, knee.hi, knee.floor)


@pytest.mark.parametrize("factor", [1.0, 2.0])
def test_an_intervention_stops_once_its_move_is_decided(factor):
    """On simulated servers: a parent's knee, then an intervention from it on a server
    `factor` times as fast. It stops `decided` with the move the search run to
    convergence gives, in fewer probes, after a rate has broken (what fills next)."""
    bounds = SearchBounds(start=0.5, maximum=256, budget=20)
    knee, against = parent_knee_on_a_queue(bounds)
    server = QueueServer(life_s=1.9 / factor)

    def run(early: bool) -> CapacitySearch:
        s = CapacitySearch(bounds, first=knee.lo, against=against if early else None, min_shift=0.3)
        while (rate := s.next_rate()) is not None:
            s.record(server.probe(rate, 40.0, 100 + len(s.probes)))
        return s

    early, full = run(True), run(False)
    r_early, r_full = early.result(), full.result()
    assert r_early.reason == StopReason.DECIDED and r_full.reason == StopReason.CONVERGED
    span = lambda r: Span.of(r.lo, r.hi, r.floor)  # noqa: E731
    assert move(against, span(r_early), 0.3) == move(against, span(r_full), 0.3)
    assert move(against, span(r_early), 0.3) is (Move.UP if factor == 2 else Move.NO)
    assert r_early.hi is not None and len(early.probes) < len(full.probes)
    # resumed from its probes, the search stops at the same place
    again = CapacitySearch(bounds, early.probes, first=knee.lo, against=against, min_shift=0.3)
    assert again.finished and again.result().reason == StopReason.DECIDED


@pytest.mark.parametrize("factor", [1.0, 1.7, 2.5])
def test_an_intervention_started_at_its_predicted_knee_decides_the_same_in_fewer_probes(factor):
    """From its parent's knee an intervention climbs to its own by steps of x1.25, x1.56,
    ...; from the parent's knee moved by the predicted shift (off by up to 15 % either
    way) it brackets its own at once: the same move in fewer probes over the seeds, never
    in more than one extra."""
    bounds = SearchBounds(start=0.5, maximum=256, budget=20)
    knee, against = parent_knee_on_a_queue(bounds)
    server = QueueServer(life_s=1.9 / factor)

    def run(first: float, seed: int) -> CapacitySearch:
        s = CapacitySearch(bounds, first=first, against=against, min_shift=0.3)
        while (rate := s.next_rate()) is not None:
            s.record(server.probe(rate, 40.0, seed + len(s.probes)))
        return s

    total_parent = total_predicted = 0
    for seed, error in enumerate((0.85, 0.95, 1.0, 1.05, 1.15)):
        from_parent, predicted = run(knee.lo, 100 * seed), run(knee.lo * factor * error, 100 * seed)
        span = lambda s: Span.of(s.result().lo, s.result().hi, s.result().floor)  # noqa: E731
        assert move(against, span(predicted), 0.3) == move(against, span(from_parent), 0.3)
        assert len(predicted.probes) <= len(from_parent.probes) + 1
        total_parent += len(from_parent.probes)
        total_predicted += len(predicted.probes)
    if factor == 1.0:  # nothing to predict: the same start
        assert total_predicted <= total_parent
    else:
        assert total_predicted < total_parent
