"""The frontiers: config section: schema, defaults, cross-references, the plan read out of it."""

from __future__ import annotations

import copy

import pytest

from filledfirst.config import load_config, validate_config
from filledfirst.contracts.search import SearchBounds, Slo
from filledfirst.errors import UserError
from filledfirst.frontier.plan import frontier_plan
from filledfirst.study import Study

from conftest import REPO

E2E = REPO / "tests" / "configs" / "e2e.yaml"
FRONTIER = {
    "workload": "light",
    "settings": {"default": {}, "seq8": {"max_num_seqs": 8}, "kv160": {"num_gpu_blocks_override": 160}},
    "slo": {"ttft_ms": 1000, "itl_ms": 200},
    "start": 1,
    "maximum": 64,
}


@pytest.fixture
def cfg():
    cfg = copy.deepcopy(load_config([E2E]))
    cfg["workloads"]["light"]["phases"][0]["interval_s"] = 0.5
    cfg["frontiers"] = {"capacity": copy.deepcopy(FRONTIER)}
    return cfg


def test_defaults_are_filled_in(cfg):
    validate_config(cfg)
    f = cfg["frontiers"]["capacity"]
    assert {k: f[k] for k in ("target_attainment", "probe_s", "growth", "precision", "budget", "repeats")} == {
        "target_attainment": 0.95, "probe_s": 15, "growth": 2, "precision": 1.1, "budget": 12, "repeats": 0,
    }


def test_the_plan_layers_each_setting_on_engine_server(cfg):
    validate_config(cfg)
    study = Study.from_dict(cfg)
    plan = frontier_plan(study, "capacity")
    engine = cfg["engine"]["server"]
    assert plan.settings == {
        "default": engine,
        "seq8": {**engine, "max_num_seqs": 8},
        "kv160": {**engine, "num_gpu_blocks_override": 160},
    }
    assert plan.workload_name == "light" and plan.workload == study.workloads["light"]
    assert plan.slo == Slo(1000.0, 200.0) and plan.probe_s == 15.0
    assert plan.bounds == SearchBounds(start=1, maximum=64, target=0.95, growth=2, precision=1.1, budget=12, repeats=0)


def test_a_config_without_frontiers_is_still_valid(cfg):
    del cfg["frontiers"]
    validate_config(cfg)


@pytest.mark.parametrize("mutate, expected", [
    (lambda f: f.update(workload="nope"),
     "frontiers.capacity.workload: 'nope' is not in workloads "
     "(['azure', 'heavy', 'light', 'long_prompts', 'long_prompts_control'])"),
    (lambda f: f.update(start=64, maximum=8),
     "frontiers.capacity: start (64) must be below maximum (8)"),
    (lambda f: f.update(workload="heavy"),  # all 64 requests at once: no rate to scale
     "frontiers.capacity.workload: 'heavy': the workload sends all its requests at once"),
    (lambda f: f.update(precision=1.5),
     "frontiers.capacity.precision: 1.5 is greater than the maximum of 1.1"),
    (lambda f: f.update(precision=1.0),
     "frontiers.capacity.precision: 1.0 is less than or equal to the minimum of 1"),
    (lambda f: f.update(growth=1),
     "frontiers.capacity.growth: 1 is less than or equal to the minimum of 1"),
    (lambda f: f.update(target_attainment=1.2),
     "frontiers.capacity.target_attainment: 1.2 is greater than the maximum of 1"),
    (lambda f: f.update(budget=0),
     "frontiers.capacity.budget: 0 is less than the minimum of 1"),
    (lambda f: f["settings"]["seq8"].update(max_num_seq=8),
     "frontiers.capacity.settings.seq8: Additional properties are not allowed ('max_num_seq' was unexpected)"),
    (lambda f: f["settings"].clear(),
     "frontiers.capacity.settings: {} should be non-empty"),
    (lambda f: f["slo"].pop("itl_ms"),
     "frontiers.capacity.slo: 'itl_ms' is a required property"),
    (lambda f: f.pop("maximum"),
     "frontiers.capacity: 'maximum' is a required property"),
    (lambda f: f.update(rate=3),
     "frontiers.capacity: Additional properties are not allowed ('rate' was unexpected)"),
])
def test_errors_name_the_key_path(cfg, mutate, expected):
    mutate(cfg["frontiers"]["capacity"])
    with pytest.raises(UserError) as err:
        validate_config(cfg)
    assert expected in str(err.value)


def test_a_bad_frontier_name_is_refused(cfg):
    cfg["frontiers"]["bad name"] = cfg["frontiers"].pop("capacity")
    with pytest.raises(UserError, match="frontiers: 'bad name' does not match"):
        validate_config(cfg)


def test_a_trace_workload_is_a_valid_shape(cfg):
    cfg["frontiers"]["capacity"]["workload"] = "azure"
    validate_config(cfg)
