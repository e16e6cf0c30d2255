"""A closed-loop sweep is one config entry with its concurrency list; it stands for the
workloads and experiments written out one by one, down to their fingerprints."""

from __future__ import annotations

import pytest
import yaml

from filledfirst.config import group_fingerprint, load_config, server_groups, spec_document
from filledfirst.errors import UserError
from filledfirst.study import Study, as_study

from conftest import REPO

E2E = REPO / "tests" / "configs" / "e2e.yaml"
SWEEP = {"concurrency": [1, 2, 4], "prompt_tokens": 150, "output_tokens": 128, "section": "concurrency_sweep"}


def written_out(cfg: dict) -> dict:
    """The same sweep as a config wrote it before `sweeps`: a workload and an experiment each."""
    for n in SWEEP["concurrency"]:
        cfg["workloads"][f"sweep_c{n}"] = {"kind": "synthetic", "phases": [
            {"role": "sweep", "count": 4 * n, "prompt_tokens": 150, "output_tokens": 128}]}
        cfg["experiments"][f"sweep_c{n}"] = {
            "description": f"closed loop, {n} worker{'s' if n > 1 else ''}", "workload": f"sweep_c{n}",
            "loadgen": {"mode": "closed", "concurrency": n}, "section": "concurrency_sweep"}
    return cfg


def load(tmp_path, cfg: dict, name: str) -> dict:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return load_config([path])


def test_a_sweep_stands_for_its_runs_written_out(tmp_path):
    base = yaml.safe_load(E2E.read_text())
    swept = load(tmp_path, {**base, "sweeps": {"sweep": SWEEP}}, "swept")
    by_hand = load(tmp_path, written_out(yaml.safe_load(E2E.read_text())), "by_hand")
    assert list(swept["experiments"]) == list(by_hand["experiments"])  # the sweep's last, in its order
    assert list(swept["experiments"])[-3:] == ["sweep_c1", "sweep_c2", "sweep_c4"]
    assert swept["workloads"] == by_hand["workloads"]
    for name in swept["experiments"]:
        assert spec_document(as_study(swept), name) == spec_document(as_study(by_hand), name)
    assert server_groups(as_study(swept)) == server_groups(as_study(by_hand))
    assert {g: group_fingerprint(as_study(swept), m) for g, m in server_groups(as_study(swept)).items()} == {
        g: group_fingerprint(as_study(by_hand), m) for g, m in server_groups(as_study(by_hand)).items()}
    # the typed study of the config as written (Snakemake's) has them too
    raw = Study.from_dict({**base, "sweeps": {"sweep": SWEEP}})
    assert raw.experiments == Study.from_dict(by_hand).experiments
    assert raw.loadgen_for("sweep_c4").concurrency == 4 and raw.experiments["sweep_c4"].section == "concurrency_sweep"


def test_a_sweep_may_not_take_a_written_runs_name(tmp_path):
    cfg = yaml.safe_load(E2E.read_text())
    cfg["sweeps"] = {"sweep": SWEEP}
    cfg["workloads"]["sweep_c2"] = {"kind": "synthetic", "phases": [
        {"role": "other", "count": 3, "prompt_tokens": 10, "output_tokens": 5}]}
    with pytest.raises(UserError, match="sweeps.sweep: 'sweep_c2' is already a workload or an experiment"):
        load(tmp_path, cfg, "clash")


def test_a_sweeps_section_must_exist(tmp_path):
    cfg = yaml.safe_load(E2E.read_text())
    cfg["sweeps"] = {"sweep": {**SWEEP, "section": "nope"}}
    with pytest.raises(UserError, match=r"sweeps.sweep.section: 'nope' is not in sections"):
        load(tmp_path, cfg, "nosection")


def test_a_sweep_may_run_on_settings_of_its_own(tmp_path):
    # the same concurrencies at one slot and at four: two sweeps, two servers
    cfg = yaml.safe_load(E2E.read_text())
    cfg["sweeps"] = {"one": {**SWEEP, "server": {"max_num_seqs": 1}}, "four": {**SWEEP, "server": {"max_num_seqs": 4}}}
    study = as_study(load(tmp_path, cfg, "two"))
    assert study.experiments["one_c4"].server == {"max_num_seqs": 1}
    assert study.experiments["four_c1"].server == {"max_num_seqs": 4}
    groups = [set(members) for members in server_groups(study).values()]
    assert {"one_c1", "one_c2", "one_c4"} in groups and {"four_c1", "four_c2", "four_c4"} in groups
