"""An old key is refused with the key that replaced it, never read as the new one."""

from __future__ import annotations

import pytest
import yaml

from filledfirst import study
from filledfirst.config import deep_merge, load_config, schema_problem
from filledfirst.errors import UserError

from conftest import REPO

CONFIGS = REPO / "tests" / "configs"

# One config use per renamed key (filledfirst.study.RENAMED): where the old key goes.
OLD_KEYS: dict[tuple[str, ...], object] = {
    ("frontiers", "*", "verify"): ["default"],
    ("frontiers", "*", "verify_factor"): 4,
    ("frontiers", "*", "verify_min_shift"): 0.3,
    ("workloads", "*", "phases", "[]", "interval_s"): {"of": "knee/default", "times": 2},
    ("workloads", "*", "time_scale"): {"of": "knee/default", "times": 2},
    ("parts",): "original-study.yaml",
    ("experiments", "*", "part"): "interference",
    ("experiments", "*", "isolate"): True,
    ("share_search_servers",): False,
}


def _put(cfg: dict, path: tuple[str, ...], value: object) -> str:
    """`value` at `path`, "*" the first name there and "[]" the first item; the key path written."""
    node, where = cfg, []
    for key in path[:-1]:
        if key == "*":
            key = next(iter(node))
        if key == "[]":
            node, where[-1] = node[0], f"{where[-1]}[0]"
            continue
        node = node.setdefault(key, {})
        where.append(key)
    node[path[-1]] = value
    return ".".join([*where, path[-1]])


def test_every_renamed_key_has_a_case_here():
    assert {r.path for r in study.RENAMED} == set(OLD_KEYS)


@pytest.mark.parametrize("rule", study.RENAMED, ids=lambda r: ".".join(r.path))
def test_an_old_key_is_refused_with_its_new_name(rule, tmp_path):
    cfg = deep_merge(*(yaml.safe_load((CONFIGS / f).read_text()) for f in ("e2e.yaml", "frontier.yaml")))
    where = _put(cfg, rule.path, OLD_KEYS[rule.path])
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    with pytest.raises(UserError) as err:
        load_config([path])
    assert f"{where}: renamed; write {rule.new}" in str(err.value)
    assert schema_problem(cfg) == f"{where}: renamed; write {rule.new}"  # Snakemake's own validation says it too


def test_keys_are_found_wherever_a_path_matches(monkeypatch):
    rule = study.Renamed(("workloads", "*", "phases", "[]", "interval_s"), "rate", lambda v: isinstance(v, dict))
    cfg = {"workloads": {"a": {"phases": [{"interval_s": 0.1}, {"interval_s": {"of": "f/s", "times": 1}}]},
                        "b": {"phases": [{"interval_s": {"of": "f/s", "times": 2}}]}}}
    monkeypatch.setattr(study, "RENAMED", (rule,))
    assert study.renamed_keys(cfg) == ["workloads.a.phases[1].interval_s: renamed; write rate",
                                       "workloads.b.phases[0].interval_s: renamed; write rate"]
