"""Which experiments share a server start, and the pieces that let them share it safely."""

import copy
import dataclasses

import pytest

from filledfirst.cli import main
from filledfirst.config import (
    check_shareable,
    group_fingerprint,
    hosted_experiments,
    load_config,
    search_groups,
    server_groups,
    validate_config,
)
from filledfirst.contracts.gauges import Gauges
from filledfirst.engine.shared import ServerNotIdle, SharedServer
from filledfirst.errors import UserError
from filledfirst.study import as_study

from conftest import REPO

E2E = REPO / "tests" / "configs" / "e2e.yaml"


@pytest.fixture
def cfg() -> dict:
    """Four experiments, in this config order: a, b (max_num_seqs 8), c, d."""
    base = load_config([E2E])
    base["experiments"] = {
        "a": {"workload": "light"},
        "b": {"workload": "heavy", "server": {"max_num_seqs": 8}},
        "c": {"workload": "heavy"},
        "d": {"workload": "light", "loadgen": {"mode": "closed", "concurrency": 2}},
    }
    validate_config(base)
    return base


def test_identical_settings_share_and_order_is_config_order(cfg):
    # d's load generator differs: the client's business, not the server's
    assert server_groups(as_study(cfg)) == {"a": ["a", "c", "d"], "b": ["b"]}


def test_config_order_decides_group_name_and_order(cfg):
    cfg["experiments"] = {k: cfg["experiments"][k] for k in ("d", "c", "b", "a")}
    assert server_groups(as_study(cfg)) == {"d": ["d", "c", "a"], "b": ["b"]}


def test_a_setting_equal_to_the_engine_default_still_shares(cfg):
    cfg["experiments"]["c"]["server"] = {"max_num_seqs": cfg["engine"]["server"]["max_num_seqs"]}
    assert server_groups(as_study(cfg))["a"] == ["a", "c", "d"]


@pytest.mark.parametrize("change", [
    lambda c: c["experiments"]["c"].update(server={"enable_prefix_caching": True}),
    lambda c: c["experiments"]["c"].update(server={"kv_cache_space_gib": 2}),
])
def test_a_different_server_setting_splits(cfg, change):
    change(cfg)
    assert server_groups(as_study(cfg)) == {"a": ["a", "d"], "b": ["b"], "c": ["c"]}


def test_same_non_default_settings_share(cfg):
    cfg["experiments"]["c"]["server"] = {"max_num_seqs": 8}
    assert server_groups(as_study(cfg)) == {"a": ["a", "d"], "b": ["b", "c"]}


def test_an_experiment_that_does_not_share_splits(cfg):
    cfg["experiments"]["a"]["share_server"] = False
    validate_config(cfg)  # the schema knows the key
    assert server_groups(as_study(cfg)) == {"a": ["a"], "b": ["b"], "c": ["c", "d"]}


def test_share_server_must_be_a_boolean(cfg):
    cfg["experiments"]["a"]["share_server"] = "yes"
    with pytest.raises(UserError, match="share_server"):
        validate_config(cfg)


def test_every_experiment_in_exactly_one_group_or_search_of_the_shipped_configs():
    for name in ("config.yaml", "cpu.yaml"):
        c = load_config([REPO / "config" / name])
        members = [e for group in server_groups(as_study(c)).values() for e in group]
        hosted = [e for exps in hosted_experiments(as_study(c)).values() for e in exps]
        assert sorted(members + hosted) == sorted(c["experiments"])


def test_a_search_hosts_the_experiments_placed_on_its_knee_that_need_its_server():
    c = load_config([REPO / "config" / "cpu.yaml"])
    hosted = hosted_experiments(as_study(c))
    assert hosted["prefix/cache_on_reduced"] == ["prefix_evicted"]
    assert hosted["prefix/cache_on"] == ["mooncake_cache_on"]
    assert hosted["decode/capped"] == ["seq_limit"]
    # in config order, after the search
    assert hosted["decode/default"] == ["interference", "interference_control", "decode_low", "decode_high"]
    # placed on decode/default's knee, but on 160 KV blocks: a server group with the other
    # experiment on 160 blocks, in config order
    assert "kv_reduced" not in {e for exps in hosted.values() for e in exps}
    assert server_groups(as_study(c))["kv_reduced"] == ["kv_reduced", "kv_head"]
    # on the capped knee with the default server: in the default group, not hosted by it
    assert "seq_default" in server_groups(as_study(c))["seq_default"]
    # no interventions host: nothing is placed on their knees
    assert not [k for k in hosted if "_x2" in k]


def test_an_experiment_or_a_study_that_does_not_share_gets_servers_of_its_own():
    c = load_config([REPO / "config" / "cpu.yaml"])
    c["experiments"]["prefix_evicted"]["share_server"] = False
    assert "prefix/cache_on_reduced" not in hosted_experiments(as_study(c))
    assert server_groups(as_study(c))["prefix_evicted"] == ["prefix_evicted"]
    assert len(server_groups(as_study(c))["seq_default"]) > 1
    c["share_server"] = False
    assert hosted_experiments(as_study(c)) == {}
    groups = server_groups(as_study(c))
    assert sorted(groups) == sorted(c["experiments"]) and all(len(g) == 1 for g in groups.values())


def test_searches_that_probe_the_same_server_share_one_job():
    """The default settings of three frontiers: one server start, in config order; every
    other setting alone; the interventions, judged side by side alone in the shipped
    studies, in no group: their parent's job checks them."""
    from filledfirst.config import checks_of

    for name in ("config.yaml", "cpu.yaml"):
        c = load_config([REPO / "config" / name])
        groups = search_groups(as_study(c))
        assert groups["decode/default"] == ["decode/default", "prefix/cache_off", "azure/default"]
        members = [key for group in groups.values() for key in group]
        checked = [key for keys in checks_of(as_study(c)).values() for key in keys]
        assert set(checked) == {f"{f}/{s}" for f, plan in _plans(c).items() for s in plan.interventions}
        assert all(parent in members for parent in checks_of(as_study(c)))
        study_searches = [f"{f}/{s}" for f, plan in _plans(c).items() for s in plan.settings]
        assert sorted(members + checked) == sorted(study_searches)  # each setting in exactly one job
        assert all(len(group) == 1 for lead, group in groups.items() if lead != "decode/default")
        c["share_server"] = False
        assert all(len(group) == 1 for group in search_groups(as_study(c)).values())


def _plans(cfg):
    from filledfirst.frontier.plan import frontier_plan
    from filledfirst.study import Study

    study = Study.from_dict(cfg)
    return {name: frontier_plan(study, name) for name in study.frontiers}


def test_a_hosted_experiments_bound_takes_the_lowest_knee_its_search_can_report():
    """prefix_evicted: 200 requests at twice the reduced KV knee; at the search's start (1/s) the
    arrivals span 100 s, allowed twice that, then the drain."""
    from filledfirst.cluster import hosted_seconds
    from filledfirst.deadline import run_deadline_s
    from filledfirst.study import Study

    c = load_config([REPO / "config" / "cpu.yaml"])
    study = Study.from_dict(c)
    loadgen = study.loadgen_for("prefix_evicted")
    expected = run_deadline_s("open", 0, None, 2 * 200 / 2.0, loadgen.request_timeout_s, loadgen.drain_timeout_s)
    assert hosted_seconds(study, "prefix_evicted") == expected
    with pytest.raises(FileNotFoundError):  # a trace's window is read once it is fetched
        hosted_seconds(study, "mooncake_cache_on", "/nonexistent/mooncake_conv.csv")


def test_group_fingerprint_follows_any_member(cfg):
    before = group_fingerprint(as_study(cfg), ["a", "c"])
    changed = copy.deepcopy(cfg)
    changed["experiments"]["c"]["description"] = "now described"
    assert group_fingerprint(as_study(changed), ["a", "c"]) != before
    assert group_fingerprint(as_study(cfg), ["c", "a"]) != before  # order is part of the measurement


def test_a_new_engine_version_is_a_new_measurement(cfg, monkeypatch):
    from filledfirst import config

    study = as_study(cfg)
    searched = as_study(load_config([E2E, REPO / "tests" / "configs" / "frontier.yaml"]))
    frontier = next(iter(searched.frontiers))
    setting = next(iter(searched.frontiers[frontier].settings))
    endpoint = {"url": "http://10.0.0.1:8000"}
    spec, external = config.spec_document(study, "a"), {**config.spec_document(study, "a"), "server": endpoint}
    before = (group_fingerprint(study, ["a", "c"]), config.search_fingerprint(searched, frontier, setting),
              config.spec_fingerprint(spec), config.spec_fingerprint(external))
    monkeypatch.setattr(config, "engine_version", lambda launcher=None: "99.0.0")
    after = (group_fingerprint(study, ["a", "c"]), config.search_fingerprint(searched, frontier, setting),
             config.spec_fingerprint(spec), config.spec_fingerprint(external))
    assert [b != a for b, a in zip(before, after)] == [True, True, True, False]  # an endpoint's is not ours


@pytest.mark.parametrize("names, message", [
    (["a", "b"], "different server"),
    (["a", "nope"], "not in the config"),
    (["a", "a"], "given twice"),
])
def test_refuses_experiments_that_cannot_share(cfg, names, message):
    with pytest.raises(UserError, match=message):
        check_shareable(as_study(cfg), names)


def test_refuses_to_share_an_experiment_that_does_not_share(cfg):
    cfg["experiments"]["c"]["share_server"] = False
    with pytest.raises(UserError, match="share_server: false"):
        check_shareable(as_study(cfg), ["a", "c"])
    check_shareable(as_study(cfg), ["c"])  # alone is fine


def test_cli_needs_one_schedule_and_out_per_experiment(tmp_path, capsys):
    code = main(["run", "--config", str(E2E), "--experiment", "reference", "--experiment", "azure_replay",
                 "--schedule", str(tmp_path / "s.parquet"), "--out", str(tmp_path / "r")])
    assert code == 2 and "once per experiment" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before anything was written


class _Stub:
    """Stands in for a VllmServer: answers /metrics from a list of loads."""

    def __init__(self, loads):
        self.loads = list(loads)

    def alive(self):
        return True

    def resume(self):  # never paused
        pass

    def scheduler_load(self):
        return self.loads.pop(0) if len(self.loads) > 1 else self.loads[0]


def shared_with(loads, tmp_path, timeout_s=5.0) -> SharedServer:
    shared = SharedServer({}, tmp_path / "server.log", idle_timeout_s=timeout_s)
    shared.server = _Stub(loads)
    return shared


def test_waits_until_nothing_runs_or_waits(tmp_path):
    busy = Gauges(running=2.0, waiting=1.0, kv_pct=10.0)
    idle = Gauges(running=0.0, waiting=0.0, kv_pct=0.0)
    shared = shared_with([busy, None, dataclasses.replace(busy, running=0.0), idle], tmp_path)
    assert shared.ready("next") >= 3 * 0.2  # three polls that were not idle


def test_a_server_that_never_idles_is_a_clear_error(tmp_path):
    shared = shared_with([Gauges(running=3.0, waiting=0.0, kv_pct=0.0)], tmp_path, timeout_s=0.6)
    seen = r"\(running 3  waiting 0  KV 0.0%\)"
    with pytest.raises(ServerNotIdle, match=r"not idle 1 s after the previous experiment " + seen):
        shared._wait_idle()


def test_log_parts_are_contiguous(tmp_path):
    shared = SharedServer({}, tmp_path / "server.log")
    assert shared.copy_log(0, tmp_path / "none.log") == 0  # never started: empty
    shared.log_path.write_bytes(b"start-up\nfirst\n")
    end = shared.copy_log(0, tmp_path / "1.log")
    with open(shared.log_path, "ab") as f:
        f.write(b"second\n")
    shared.copy_log(end, tmp_path / "2.log")
    assert (tmp_path / "1.log").read_bytes() == b"start-up\nfirst\n"
    assert (tmp_path / "2.log").read_bytes() == b"second\n"


def test_an_external_endpoint_is_a_group_of_its_own(cfg):
    cfg["experiments"]["c"]["server"] = {"url": "http://10.0.0.7:8000", "api_key_env": "KEY"}
    cfg["experiments"]["e"] = {"workload": "light", "server": {"url": "http://10.0.0.7:8000"}}
    validate_config(cfg)
    assert server_groups(as_study(cfg)) == {"a": ["a", "d"], "b": ["b"], "c": ["c"], "e": ["e"]}
    with pytest.raises(UserError, match="external endpoint"):
        check_shareable(as_study(cfg), ["c", "e"])


@pytest.mark.parametrize("server", [
    {"url": "http://10.0.0.7:8000", "enforce_eager": True},  # how to start a server we do not start
    {"url": "http://10.0.0.7:8000", "max_num_seqs": 0},  # a limit it cannot have
    {"url": "10.0.0.7:8000"},  # no scheme
    {"api_key_env": "KEY"},  # a key without an endpoint
])
def test_an_external_endpoint_takes_a_url_a_key_variable_and_its_limits(cfg, server):
    cfg["experiments"]["c"]["server"] = server
    with pytest.raises(UserError, match=r"experiments\.c\.server"):
        validate_config(cfg)


def test_the_token_budget_a_start_logged_is_the_one_it_records(tmp_path):
    """vLLM logs the budget when it is given; a log shared by several starts holds each
    start's own after its offset, and a start that logged none has none."""
    log = tmp_path / "server.log"
    log.write_text("(APIServer pid=1) INFO [scheduler.py:307] Chunked prefill is enabled with "
                   "max_num_batched_tokens=64.\n")
    shared = SharedServer({}, log)
    assert shared._logged_budget() == 64
    shared.start_offset = log.stat().st_size
    with open(log, "a") as f:
        f.write("(APIServer pid=2) INFO [scheduler.py:307] Chunked prefill is enabled with "
                "max_num_batched_tokens=2048.\n")
    assert shared._logged_budget() == 2048
    shared.start_offset = log.stat().st_size
    assert shared._logged_budget() is None
    assert SharedServer({}, tmp_path / "none.log")._logged_budget() is None
