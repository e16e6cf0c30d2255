"""`filledfirst frontier run` with stand-ins for vLLM (helpers/fake_server.py) and the
replay, as in test_group_runs: each probe's requests meet the SLO in the share a
simulated capacity curve gives at the probe's rate. The probes must land as ordinary run
folders with their frontier block, the search as search.json; an interrupted search
resumes from its finished probes."""

from __future__ import annotations

import copy
import json
import math

import pytest

from filledfirst import cli, config, interrupts
from filledfirst.config import load_config, search_fingerprint
from filledfirst.contracts.records import TokenRecord
from filledfirst.contracts.search import ResultRecord, SearchRecord, Slo, StopReason
from filledfirst.frontier.plan import frontier_plan
from filledfirst.frontier.search import CapacitySearch, ProbeOutcome
from filledfirst.loadgen.replay import Replay
from filledfirst.run import search as frun
from filledfirst.store.ingest import ingest
from filledfirst.study import Study, as_study

from conftest import REPO
from helpers.contracts import assert_round_trips
from helpers.fake_server import FakeShared

CAPACITY = 9.0  # req/s: at or below it every request meets the SLO
SLO_TTFT_MS, SLO_ITL_MS = 500.0, 100.0


def curve(rate: float) -> float:
    """Share of requests meeting the SLO at `rate`: all up to CAPACITY, then falling."""
    return 1.0 if rate <= CAPACITY else max(0.0, 1.0 - 2 * (rate - CAPACITY) / CAPACITY)


@pytest.fixture
def study(tmp_path, monkeypatch):
    cfg = copy.deepcopy(load_config([REPO / "tests" / "configs" / "e2e.yaml"]))
    cfg["workloads"]["light"]["phases"][0]["interval_s"] = 0.5
    cfg["frontiers"] = {"cap": {
        "workload": "light", "settings": {"default": {}, "seq8": {"max_num_seqs": 8}},
        "slo": {"ttft_ms": SLO_TTFT_MS, "itl_ms": SLO_ITL_MS}, "start": 1, "maximum": 64, "probe_s": 4,
        # The probe machinery from `start`, each share as exact (the estimate and the
        # interval have tests of their own below).
        "estimate": False, "confidence": 0,
    }}
    from filledfirst.config import validate_config

    validate_config(cfg)
    state = {"shared": None, "rates": [], "during": {}}

    def make_shared(spec, log_path):
        state["shared"] = FakeShared(log_path)
        return state["shared"]

    original_workload = frun.Prober.workload

    def workload(self, rate, schedule, probe_s):
        state["rates"].append(rate)
        return original_workload(self, rate, schedule, probe_s)

    async def fake_run(replay):
        probe = len(state["rates"])
        rate = state["rates"][-1]
        replay.t_end, replay.client_cpu_s = 4.0, 0.1
        if state["shared"].replayed(replay, f"probe {probe}", state["during"].get(probe)):
            return
        met = round(curve(rate) * len(replay.requests))
        for i, r in enumerate(replay.requests):
            late = i >= met  # the last ones miss: half by TTFT, half by a stall
            r.status, r.t_sent = "ok", r.t_scheduled
            r.t_first_token = r.t_scheduled + (2 * SLO_TTFT_MS if late and i % 2 else 0.05 * SLO_TTFT_MS) / 1000
            gap = (2 * SLO_ITL_MS if late and not i % 2 else 0.2 * SLO_ITL_MS) / 1000
            r.t_last_token = r.t_done = r.t_first_token + gap
            if "life_s" in state:  # requests that live longer than their first token and a gap
                r.t_done = r.t_scheduled + state["life_s"]
            r.output_tokens_received, r.prompt_tokens_received = 2, r.prompt_tokens
            replay.tokens.append(TokenRecord(r.request_id, 0, r.t_first_token, 1))
            replay.tokens.append(TokenRecord(r.request_id, 1, r.t_last_token, 1))

    monkeypatch.setattr(frun, "SharedServer", make_shared)
    monkeypatch.setattr(frun.Prober, "workload", workload)
    monkeypatch.setattr(Replay, "run", fake_run)
    monkeypatch.setattr(frun, "install_interrupt_handlers", lambda: None)
    monkeypatch.setattr(frun, "watch_owners", lambda: None)
    monkeypatch.setattr(interrupts, "_interrupt_reason", None)
    return cfg, tmp_path / "frontiers" / "cap" / "default", state


def run_search(cfg, frontier, setting, out, **kw):
    """`filledfirst frontier run` as the command line calls it: the config typed, the
    search's identity from the config as written."""
    return frun.run_frontier(Study.from_dict(cfg), frontier, setting, out,
                             fingerprint=search_fingerprint(as_study(cfg), frontier, setting), **kw)


def expected_search(cfg) -> CapacitySearch:
    """The same search driven by the curve directly."""
    plan = frontier_plan(Study.from_dict(cfg), "cap")
    search = CapacitySearch(plan.bounds)
    while (rate := search.next_rate()) is not None:
        n = max(1, round(12 * rate * plan.probe_s / 12))
        search.record(ProbeOutcome(rate, round(curve(rate) * n) / n))
    return search


def run_json(path):
    return assert_round_trips(path / "run.json")


def test_probes_are_run_folders_and_search_json_is_the_search(study):
    cfg, out, state = study
    search = run_search(cfg, "cap", "default", out, progress=False)
    expected = expected_search(cfg)
    result = expected.result()
    assert state["shared"].starts == ["cap/default/p01"]  # one server start for the whole search
    assert [p.rate for p in search.probes] == [p.rate for p in expected.probes]
    assert search.result == ResultRecord(lo=result.lo, hi=result.hi, ratio=result.ratio,
                                         reason=StopReason.CONVERGED, error=None, floor=result.lo / 1.1,
                                         confidence=0.0)
    assert search.estimate is None and search.check is None and search.drift is None
    assert result.lo <= CAPACITY < result.hi
    written = out / "search.json"
    assert SearchRecord.read(written) == search
    assert_round_trips(written)
    assert written.read_text() == json.dumps(search.to_doc(), indent=2, sort_keys=True) + "\n"
    assert search.bounds.start == 1 and search.slo == Slo(ttft_ms=SLO_TTFT_MS, itl_ms=SLO_ITL_MS)
    for i, probe in enumerate(search.probes, start=1):
        folder = out / probe.run_dir
        assert probe.run_dir == f"p{i:02d}"
        meta = run_json(folder)
        assert meta["experiment"] == f"cap/default/p{i:02d}" and meta["status"] == "ok"
        f = meta["frontier"]
        assert (f["name"], f["setting"], f["probe"], f["rate"]) == ("cap", "default", i, probe.rate)
        assert f["attainment"] == probe.attainment == expected.probes[i - 1].attainment
        assert f["held"] == (f["attainment"] >= 0.95) == probe.held
        assert f["requests"] == meta["schedule"]["requests"] == probe.requests
        assert f["missed"]["ttft"] + f["missed"]["itl"] == round((1 - f["attainment"]) * f["requests"])
        assert meta["spec"]["loadgen"]["mode"] == "open" and meta["server"]["settings"]["max_num_seqs"] == 64
        assert (folder / "server.log").read_text().endswith(f"requests of probe {i}\n")
        assert probe.reused is False
    assert not list(out.glob(".*"))  # no scratch log or temp folder left
    # The folders are ordinary runs: ingest takes the search.json for its probes.
    ids = ingest([written], out.parent / "db.duckdb")
    assert ids == [p.run_id for p in search.probes]


def test_the_setting_is_layered_on_engine_server(study):
    cfg, out, state = study
    out = out.parent / "seq8"
    run_search(cfg, "cap", "seq8", out, progress=False)
    meta = run_json(out / "p01")
    assert meta["server"]["settings"]["max_num_seqs"] == 8
    assert meta["server"]["settings"]["kv_cache_space_gib"] == 1


def test_an_interrupted_search_resumes_from_its_finished_probes(study, monkeypatch):
    cfg, out, state = study
    state["during"][4] = "interrupt"
    with pytest.raises(interrupts.Interrupted, match="received SIGINT"):
        run_search(cfg, "cap", "default", out, progress=False)
    assert not (out / "search.json").exists()
    assert run_json(out / "p04")["status"] == "partial"
    assert not state["shared"].alive()
    finished = {p: run_json(out / f"p0{p}")["run_id"] for p in (1, 2, 3)}

    monkeypatch.setattr(interrupts, "_interrupt_reason", None)
    state["during"].clear()
    state["rates"].clear()
    search = run_search(cfg, "cap", "default", out, progress=False)
    expected = expected_search(cfg)
    assert [p.rate for p in search.probes] == [p.rate for p in expected.probes]
    assert [p.reused for p in search.probes] == [True] * 3 + [False] * (len(expected.probes) - 3)
    assert {p: run_json(out / f"p0{p}")["run_id"] for p in (1, 2, 3)} == finished  # not measured again
    assert state["rates"] == [p.rate for p in expected.probes[3:]]  # only the rest was
    assert state["shared"].starts == ["cap/default/p04"]
    assert run_json(out / "p04")["status"] == "ok"


def test_probes_last_as_many_request_lifetimes_as_asked_and_resume_at_that_length(study, monkeypatch):
    """Requests living 3 s: after the first probe (probe_s, 4 s) every probe lasts 4
    lifetimes of the highest-rate probe that held (12 s), and offers its rate all along."""
    cfg, out, state = study
    state["life_s"] = 3.0
    state["during"][4] = "interrupt"
    with pytest.raises(interrupts.Interrupted):
        run_search(cfg, "cap", "default", out, progress=False)
    monkeypatch.setattr(interrupts, "_interrupt_reason", None)
    state["during"].clear()
    search = run_search(cfg, "cap", "default", out, progress=False)
    probes = search.probes
    assert [p.reused for p in probes[:4]] == [True] * 3 + [False]
    assert probes[0].probe_s == 4 and all(p.probe_s == pytest.approx(12) for p in probes[1:])
    for p in probes:
        assert p.lifetime_p90_s == pytest.approx(3.0)
        assert abs(p.requests - p.rate * p.probe_s) <= 1
        meta = run_json(out / p.run_dir)
        assert meta["frontier"]["probe_s"] == p.probe_s
        assert meta["schedule"]["stats"]["duration_s"] <= p.probe_s
    assert search.result.lo <= CAPACITY < search.result.hi
    # probe_max_s caps the length; another cap is another search, measured again
    cfg["frontiers"]["cap"]["probe_max_s"] = 6
    state["rates"].clear()
    search = run_search(cfg, "cap", "default", out, progress=False)
    assert [p.probe_s for p in search.probes][:2] == [4, 6] and not any(p.reused for p in search.probes)


def test_a_finished_search_is_read_back_without_a_server(study):
    cfg, out, state = study
    first = run_search(cfg, "cap", "default", out, progress=False)
    (out / "search.json").unlink()
    state["rates"].clear()
    again = run_search(cfg, "cap", "default", out, progress=False)
    assert state["rates"] == [] and state["shared"].starts == []
    assert again.result == first.result
    assert [p.run_id for p in again.probes] == [p.run_id for p in first.probes]


def test_a_changed_search_measures_everything_again(study):
    cfg, out, state = study
    run_search(cfg, "cap", "default", out, progress=False)
    n_before = len(state["rates"])
    cfg["frontiers"]["cap"]["slo"]["ttft_ms"] = 2 * SLO_TTFT_MS  # another SLO: another search
    run_search(cfg, "cap", "default", out, progress=False)
    assert len(state["rates"]) > n_before and state["rates"][n_before] == 1.0


def test_a_failed_probe_ends_the_search_with_its_reason(study):
    cfg, out, state = study
    state["during"][3] = "server dies"
    search = run_search(cfg, "cap", "default", out, progress=False)
    assert len(search.probes) == 3
    assert search.result.reason == "probe_failed"
    assert "vLLM exited during the run" in search.result.error
    assert search.result.lo == 2.0 and search.result.hi is None  # what the held probes showed
    third = search.probes[2]
    assert third.status == "partial" and third.attainment is None and third.held is None
    assert run_json(out / "p03")["frontier"]["error"] == third.error
    assert not state["shared"].alive()
    # A re-run measures the failed probe again, and the search goes on from there.
    state["during"].clear()
    search = run_search(cfg, "cap", "default", out, progress=False)
    assert search.result.reason == "converged"
    assert [p.reused for p in search.probes[:3]] == [True, True, False]


def test_a_probe_whose_server_never_starts_fails_the_search(study):
    cfg, out, state = study

    def make_shared(spec, log_path):
        state["shared"] = FakeShared(log_path, failing_starts=("cap/default/p01",))
        return state["shared"]

    frun.SharedServer = make_shared  # monkeypatched already: restored at teardown
    search = run_search(cfg, "cap", "default", out, progress=False)
    assert [p.status for p in search.probes] == ["failed"]
    assert search.result.reason == "probe_failed" and "before it was healthy" in search.result.error
    assert search.result.lo is None and search.result.hi is None


def test_the_command_line_exits_0_for_a_search_ended_by_a_failed_probe(study, monkeypatch, caplog):
    """A failed probe is a result (search.json says why): Snakemake keeps the folders."""
    cfg, out, state = study
    frun.SharedServer = lambda spec, log_path: FakeShared(log_path, failing_starts=("cap/default/p01",))
    monkeypatch.setattr(config, "load_config", lambda paths: cfg)
    argv = ["frontier", "run", "--config", "study.yaml", "--frontier", "cap", "--setting", "default",
            "--out", str(out), "--no-progress"]
    assert cli.main(argv) == 0
    assert "a probe failed (" in caplog.text and f"see {out}/search.json" in caplog.text
    assert SearchRecord.read(out / "search.json").result.reason == "probe_failed"


def test_unknown_frontier_or_setting_is_a_user_error(study):
    from filledfirst.errors import UserError

    cfg, out, state = study
    with pytest.raises(UserError, match="no setting 'nope'"):
        run_search(cfg, "cap", "nope", out, progress=False)
    with pytest.raises(UserError, match="frontier 'nope' is not in the config"):
        run_search(cfg, "nope", "default", out, progress=False)


def test_probe_attainment_counts_gaps_between_token_chunks():
    from filledfirst.contracts.records import RequestRecord
    from filledfirst.contracts.search import Slo

    reqs = [RequestRecord(0, "r", 1, 3, 0.0, 0.0, 0.1, 0.1, 0.5, 0.5, status="ok"),
            RequestRecord(1, "r", 1, 3, 0.0, 0.0, 0.1, 0.1, 0.2, 0.2, status="ok"),
            RequestRecord(2, "r", 1, 3, 0.0, 0.0, None, None, None, 1.0, status="timeout")]
    toks = [TokenRecord(0, 0, 0.1, 1), TokenRecord(0, 1, 0.15, 1), TokenRecord(0, 2, 0.5, 1),
            TokenRecord(0, 3, 0.5, 0),  # the usage chunk: no token, no gap
            TokenRecord(1, 0, 0.1, 1), TokenRecord(1, 1, 0.2, 2)]
    out = frun.probe_attainment(reqs, toks, Slo(ttft_ms=200, itl_ms=300))
    assert out["requests"] == 3 and math.isclose(out["attainment"], 1 / 3)
    assert out["missed"] == {"failed": 1, "ttft": 0, "itl": 1}  # request 0 stalled 350 ms


@pytest.mark.parametrize("ok, ttft_ms, gap_ms, met", [
    (True, 500.0, 50.0, True),
    (True, 500.0, None, True),  # one token: no gap
    (True, 1000.0, 200.0, True),  # at the limits
    (True, 1001.0, 50.0, False),  # TTFT over
    (True, 500.0, 250.0, False),  # a stall
    (False, 100.0, 10.0, False),  # failed: missed whatever its timings
    (True, None, None, False),  # no first token
    (False, None, None, False),
])
def test_probe_attainment_is_the_slo_test_of_each_request(ok, ttft_ms, gap_ms, met):
    from filledfirst.contracts.records import RequestRecord
    from filledfirst.contracts.search import Slo

    first = ttft_ms / 1000 if ttft_ms is not None else None
    last = first + gap_ms / 1000 if gap_ms is not None else first
    rec = RequestRecord(0, "r", 1, 2, 0.0, 0.0, first, first, last, (last or 0.0) + 0.01,
                        status="ok" if ok else "error")
    toks = [TokenRecord(0, i, t, 1) for i, t in enumerate(dict.fromkeys(x for x in (first, last) if x is not None))]
    out = frun.probe_attainment([rec], toks, Slo(ttft_ms=1000, itl_ms=200))
    assert out["requests"] == 1 and out["attainment"] == (1.0 if met else 0.0)


def test_a_probe_without_requests_has_no_attainment():
    from filledfirst.contracts.search import Slo

    assert frun.probe_attainment([], [], Slo(ttft_ms=1, itl_ms=1))["attainment"] is None


def test_a_trace_workload_is_probed_at_its_density_scaled(study, tmp_path, monkeypatch):
    """A trace shape: each probe is four stretches spread over the window at time_scale
    kept_per_s / rate, probe_s long in all, cut from the trace CSV; the density comes from
    the shape's schedule stats. Prober.workload hands back each schedule's stats."""
    from filledfirst.frontier.probes import offered_rate
    from filledfirst.trace.subsample import subsample_to_parquet

    from helpers.trace_files import ts2024, write_csv

    cfg, out, state = study
    offered = []
    counted = frun.Prober.workload

    def workload(self, rate, schedule, probe_s):
        wl, stats = counted(self, rate, schedule, probe_s)
        offered.append(offered_rate(stats, probe_s))
        return wl, stats

    monkeypatch.setattr(frun.Prober, "workload", workload)
    # a request every 0.5 s for 20 minutes; every 2nd kept: one per second of trace time
    csv = write_csv(tmp_path / "t.csv", [(ts2024(500_000 * i), 100, 20) for i in range(2400)])
    cfg["workloads"]["tr"] = {"kind": "trace", "trace": "azure2023_conv", "minutes": 10, "keep_every": 2}
    cfg["frontiers"]["trc"] = {**cfg["frontiers"]["cap"], "workload": "tr", "settings": {"default": {}}}
    from filledfirst.config import validate_config

    validate_config(cfg)
    shape = tmp_path / "tr.parquet"
    subsample_to_parquet(csv, shape, minutes=10, keep_every=2)
    with pytest.raises(Exception, match="give --trace-csv and --shape-stats"):
        run_search(cfg, "trc", "default", out.parent / "trc", progress=False)
    search = run_search(cfg, "trc", "default", out.parent / "trc", progress=False, trace_csv=csv,
                           shape_stats=tmp_path / "tr.parquet.stats.json")
    assert search.result.reason == "converged" and search.result.lo <= CAPACITY < search.result.hi
    for p in search.probes:
        meta = run_json(out.parent / "trc" / p.run_dir)
        stats = meta["schedule"]["stats"]
        assert stats["time_scale"] == pytest.approx(1 / p.rate)
        # probe_s 4 at the probe's rate: each stretch of `rate` trace seconds keeps one request per second
        assert abs(p.requests - 4 * p.rate) <= 4
        assert [w["start_offset_s"] for w in stats["stretches"]] == [0, 150, 300, 450]
        assert meta["spec"]["workload"]["time_scale"] == pytest.approx(1 / p.rate)
    assert offered == [p.requests / p.probe_s for p in search.probes]


def test_an_interruption_between_probes_raises_and_stops_the_server(study, monkeypatch):
    cfg, out, state = study
    original = frun.Prober.workload

    def workload(self, rate, schedule, probe_s):
        if len(state["rates"]) == 2:
            interrupts.note_interrupt("received SIGTERM")
            raise interrupts.Interrupted("received SIGTERM")
        return original(self, rate, schedule, probe_s)

    monkeypatch.setattr(frun.Prober, "workload", workload)
    with pytest.raises(interrupts.Interrupted, match="received SIGTERM"):
        run_search(cfg, "cap", "default", out, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["p01", "p02"]  # nothing half-made, no scratch
    assert not state["shared"].alive()


def test_the_command_line_exits_130_for_an_interrupted_search(study, monkeypatch):
    """The search raises; `filledfirst frontier run` turns it into 130, so Snakemake sees
    the job as not done (and no search.json is written)."""
    cfg, out, state = study
    state["during"][2] = "interrupt"
    monkeypatch.setattr(config, "load_config", lambda paths: cfg)
    argv = ["frontier", "run", "--config", "study.yaml", "--frontier", "cap", "--setting", "default",
            "--out", str(out), "--no-progress"]
    assert cli.main(argv) == 130
    assert run_json(out / "p02")["status"] == "partial"
    assert not (out / "search.json").exists()


def test_a_search_from_a_capacity_estimate_measures_it_and_the_drift(study):
    """With `estimate`, a closed loop at the setting's max_num_seqs runs before the first
    probe (its completions per second are the first rate) and again after the search;
    search.json keeps both and the drift between them. A finished search read back
    measures nothing, the closed loops included."""
    cfg, out, state = study
    cfg["frontiers"]["cap"].update({"estimate": True, "estimate_batches": 2, "confidence": 0.9})
    search = run_search(cfg, "cap", "default", out, progress=False)
    est, check = search.estimate, search.check
    assert state["shared"].starts == ["cap/default/estimate"]  # the estimate started the server
    for ref, tag in ((est, "estimate"), (check, "check")):
        meta = run_json(out / tag)
        assert ref.run_dir == tag and ref.status == "ok" and meta["status"] == "ok"
        assert meta["spec"]["loadgen"] == {**meta["spec"]["loadgen"], "mode": "closed", "concurrency": 64}
        # two rounds of 64, and at least 100 counted after the first round
        assert ref.concurrency == 64 and ref.requests == meta["schedule"]["requests"] == 164
        assert ref.throughput_rps == pytest.approx(frun.reference_throughput(out / tag, 64)[1])
    assert search.estimate_rps == search.probes[0].rate == min(est.throughput_rps, 64)
    assert search.drift.change == pytest.approx(check.throughput_rps / est.throughput_rps - 1)
    assert search.drift.drifted == (abs(search.drift.change) > 0.1)
    assert search.result.lo <= CAPACITY < search.result.hi and search.result.confidence == 0.9
    assert all(p.verdict in ("held", "broke", "inconclusive") for p in search.probes)
    assert all(p.requests >= 52 or p.probe_s == cfg["frontiers"]["cap"].get("probe_max_s", 120)
               for p in search.probes)  # long enough for the interval to show 95 %
    ids = ingest([out / "search.json"], out.parent / "db.duckdb")  # the closed loops are not probes
    assert ids == [p.run_id for p in search.probes]

    (out / "search.json").unlink()
    state["rates"].clear()
    again = run_search(cfg, "cap", "default", out, progress=False)
    assert state["rates"] == [n / 4 for n in (164, 164)]  # the closed loops' schedules, written again
    assert state["shared"].starts == []  # ... but nothing measured
    assert again.estimate == est and again.check == check and again.result == search.result


def test_an_estimate_needs_a_sequence_cap_to_fill(study, caplog):
    caplog.set_level("INFO", logger="filledfirst.run.search")
    cfg, out, state = study
    cfg["frontiers"]["cap"]["estimate"] = True
    del cfg["engine"]["server"]["max_num_seqs"]
    search = run_search(cfg, "cap", "default", out, progress=False)
    assert search.estimate is None and search.probes[0].rate == 1.0
    assert "no max_num_seqs" in caplog.text


def test_searches_that_probe_the_same_server_share_one_start(study, monkeypatch, capsys, tmp_path):
    """`filledfirst job`: a second frontier's search with the same server runs in the first
    one's job, on its start, in its own folder, with a search.json of its own; the job is
    found by its name alone, and a search of another server is in a job of its own."""
    from filledfirst.config import search_groups, validate_config

    cfg, _, state = study
    cfg["frontiers"]["again"] = {**copy.deepcopy(cfg["frontiers"]["cap"]), "settings": {"plain": {}}}
    validate_config(cfg)
    assert search_groups(as_study(cfg))["cap/default"] == ["cap/default", "again/plain"]
    assert search_groups(as_study(cfg))["cap/seq8"] == ["cap/seq8"]
    monkeypatch.setattr(config, "load_config", lambda paths: cfg)
    monkeypatch.chdir(tmp_path)  # the plan's paths are the workflow's, under its working directory
    out, second = tmp_path / "results/frontiers/cap/default", tmp_path / "results/frontiers/again/plain"
    assert cli.main(["job", "--config", "study.yaml", "frontier_cap_default", "--no-progress"]) == 0
    assert state["shared"].starts == ["cap/default/p01"]  # one start for both searches
    first, then = SearchRecord.read(out / "search.json"), SearchRecord.read(second / "search.json")
    assert (then.frontier, then.setting) == ("again", "plain")
    assert [p.rate for p in then.probes] == [p.rate for p in first.probes]  # the same curve, the same search
    meta = run_json(second / "p01")
    assert meta["server"]["started_by"] == "cap/default/p01" and meta["experiment"] == "again/plain/p01"
    # each probe's part of the one server log: the start-up line is in the first probe's only
    assert "start-up for" in (out / "p01" / "server.log").read_text()
    assert "start-up for" not in (second / "p01" / "server.log").read_text()
    assert not list(out.glob(".server-*")) and not list(second.glob(".server-*"))
    assert not (out.parent / "seq8").exists()
    capsys.readouterr()
    assert cli.main(["job", "--config", "study.yaml", "frontier_again_plain", "--no-progress"]) == 2
    assert "no job 'frontier_again_plain'" in capsys.readouterr().err


def judged_alone(cfg, monkeypatch, tmp_path, state, search: bool = False) -> list:
    """`cfg` with seq8's interventions checked side by side (and searched first with
    `search`); returns the stand-in servers as they are made, each with the folder of the
    search or check that made it."""
    from filledfirst.config import validate_config

    cfg["frontiers"]["cap"]["settings"]["seq8"] = {"max_num_seqs": 8, "kv_tokens": 32768}
    cfg["frontiers"]["cap"]["interventions"] = {"settings": ["seq8"], "paired": True, "search": search}
    # an experiment on seq8's knee and server: the job runs it after the search, before the checks
    cfg["workloads"]["half_seq8"] = {"kind": "synthetic", "phases": [
        {"role": "decode", "count": 10, "rate": {"of": "cap/seq8", "times": 0.5}, "prompt_tokens": 100,
         "output_tokens": 32}]}
    cfg["experiments"] = {"on_seq8": {"workload": "half_seq8", "expect": "reference",
                                      "server": {"max_num_seqs": 8, "kv_tokens": 32768}}}
    validate_config(cfg)
    servers: list[tuple[str, FakeShared]] = []

    def make_shared(spec, log_path):
        state["shared"] = FakeShared(log_path)
        servers.append((log_path.parent.parent.name, state["shared"]))
        return state["shared"]

    monkeypatch.setattr(frun, "SharedServer", make_shared)
    monkeypatch.setattr(config, "load_config", lambda paths: cfg)
    monkeypatch.chdir(tmp_path)
    return servers


@pytest.mark.parametrize("search, job, at", [(False, "frontier_cap_seq8", "paired3-relaxed"),
                                              (True, "frontier_cap_seq8_seqs_x2", "paired3-parent")])
def test_an_interrupted_check_stops_every_server(study, monkeypatch, tmp_path, search, job, at):
    """In its parent's job (judged alone) or after its own search: the interrupt in the
    middle block stops both sides' servers."""
    cfg, _, state = study
    servers = judged_alone(cfg, monkeypatch, tmp_path, state, search)
    if search:  # the parent's knee first
        assert cli.main(["job", "--config", "study.yaml", "frontier_cap_seq8", "--no-progress"]) == 0
    original = frun.Prober.reference

    def reference(self, tag, *args, **kw):
        if tag == at:
            raise interrupts.Interrupted("received SIGINT")
        return original(self, tag, *args, **kw)

    monkeypatch.setattr(frun.Prober, "reference", reference)
    assert cli.main(["job", "--config", "study.yaml", job, "--no-progress"]) == 130
    assert len(servers) == (3 if search else 2)  # seq8's (again for the searched check) and seq8_seqs_x2's
    assert all(s.starts for _, s in servers) and not any(s.alive() for _, s in servers)


def test_a_job_checks_its_interventions_judged_alone_after_its_search_on_its_server(study, monkeypatch, tmp_path):
    """`filledfirst job` of a setting whose interventions are judged side by side alone
    (interventions.search false): its search, then each intervention's blocks A B B A in
    the intervention's folder, the parent's server reused for the first block of each
    check and started again for the last, one server at a time, every server stopped at
    the end; the interventions have no job of their own."""
    from filledfirst.plan import build_plan

    cfg, _, state = study
    made = judged_alone(cfg, monkeypatch, tmp_path, state)
    running: list[int] = []
    original = FakeShared._start

    def start(self, experiment):
        running.append(sum(s.alive() for _, s in made))  # how many were up at this start
        original(self, experiment)

    monkeypatch.setattr(FakeShared, "_start", start)
    plan = build_plan(as_study(cfg))
    assert [j.name for j in plan.jobs if j.searches] == ["frontier_cap_default", "frontier_cap_seq8"]
    assert cli.main(["job", "--config", "study.yaml", "frontier_cap_seq8", "--no-progress"]) == 0
    servers = dict(made)
    assert len(servers) == len(made) == 3  # seq8's, then one for each intervention
    base = tmp_path / "results/frontiers/cap"
    assert SearchRecord.read(base / "seq8" / "search.json").probes
    hosted = run_json(tmp_path / "results/runs/on_seq8")
    assert hosted["server"]["after_search"] == "cap/seq8" and hosted["server"]["started_by"] == "cap/seq8/p01"
    # the first check's first block on the server the search and the experiment left up;
    # each block named after its folder: which check paid for each start of seq8's server
    assert servers["seq8"].starts == ["cap/seq8/p01", "cap/seq8_seqs_x2/paired4-parent",
                                      "cap/seq8_kv_x2/paired4-parent"]
    for setting, n, requests in (("seq8_seqs_x2", 16, 80), ("seq8_kv_x2", 8, 64)):
        doc = SearchRecord.read(base / setting / "search.json")
        assert doc.probes == [] and doc.result.reason is StopReason.NOT_SEARCHED and doc.intervention.search is False
        assert [b.side for b in doc.paired.blocks] == ["parent", "relaxed", "relaxed", "parent"]
        assert doc.paired.concurrency == n  # what the larger of the two settings holds
        for i, b in enumerate(doc.paired.blocks, 1):
            assert b.loop.run_dir == f"paired{i}-{b.side}"
            meta = run_json(base / setting / b.loop.run_dir)
            assert meta["experiment"] == f"cap/{setting}/{b.loop.run_dir}"
            assert meta["server"]["settings"]["max_num_seqs"] == (8 if b.side == "parent" else n)
            assert meta["request_status_counts"] == {"ok": requests}  # whole rounds, at least 50 after the first
        assert servers[setting].starts == [f"cap/{setting}/paired2-relaxed"]
        assert not list((base / setting).glob(".server-*"))
    assert running == [0] * len(running)  # one server at a time
    assert not any(s.alive() for _, s in made)
