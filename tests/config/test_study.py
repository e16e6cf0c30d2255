"""The typed study config and the schema cannot drift: same keys, one default each."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest
import yaml

from filledfirst import study
from filledfirst.config import SCHEMA_PATH, load_config, load_study
from filledfirst.errors import UserError
from filledfirst.study import as_study

from conftest import REPO

SCHEMA = yaml.safe_load(SCHEMA_PATH.read_text())

# schema object -> the type that reads it
SECTIONS = {
    ("properties", "study"): study.StudyInfo,
    ("properties", "model"): study.Model,
    ("properties", "model", "properties", "tiny"): study.TinyShape,
    ("properties", "model", "properties", "prompt_token_ids"): study.TokenIds,
    ("properties", "engine"): study.Engine,
    ("$defs", "server_settings"): study.ServerSettings,
    ("$defs", "external_server"): study.ExternalServer,
    ("$defs", "load_mode"): study.LoadMode,
    ("$defs", "synthetic_phase"): study.SyntheticPhase,
    ("$defs", "relative_rate"): study.RelativeRate,
    ("properties", "loadgen"): study.Loadgen,
    ("properties", "scrape"): study.Scrape,
    ("properties", "traces", "additionalProperties"): study.Trace,
    ("properties", "workloads", "additionalProperties", "oneOf", 0): study.TraceWorkload,
    ("properties", "workloads", "additionalProperties", "oneOf", 1): study.SyntheticWorkload,
    ("properties", "experiments", "additionalProperties"): study.Experiment,
    ("properties", "report"): study.Report,
    ("properties", "cluster"): study.Cluster,
    ("properties", "frontiers", "additionalProperties"): study.Frontier,
    ("properties", "frontiers", "additionalProperties", "properties", "interventions"): study.Interventions,
    ("properties", "frontiers", "additionalProperties", "properties", "slo"): study.Slo,
}
# Defaults the schema cannot hold (oneOf branches must not fill defaults): the type's own.
TYPE_ONLY_DEFAULTS = {study.TraceWorkload, study.SyntheticWorkload, study.SyntheticPhase}


def _node(path):
    node = SCHEMA
    for key in path:
        node = node[key]
    return node


def _fields(cls) -> dict:
    """name -> default (dataclasses.MISSING / msgspec.NODEFAULT when required)."""
    if dataclasses.is_dataclass(cls):
        return {f.name: f.default for f in dataclasses.fields(cls)}
    info = msgspec.inspect.type_info(cls)
    return {f.name: f.default for f in info.fields}


def test_every_schema_section_has_a_type_with_the_same_keys():
    for path, cls in SECTIONS.items():
        props = set(_node(path)["properties"]) - {"kind"}  # the workloads' tag
        assert props == set(_fields(cls)), (path, cls)
    # `document` is the config as written, kept beside its types for fingerprints
    assert set(SCHEMA["properties"]) == set(_fields(study.Study)) - {"document"}


def test_the_config_as_written_is_kept_and_is_no_config_key():
    from filledfirst.config import load_config
    from filledfirst.errors import UserError

    cfg = load_config([REPO / "config" / "cpu.yaml"])
    assert study.Study.from_dict(cfg).document == cfg
    with pytest.raises(UserError, match="document: not a config key"):
        study.Study.from_dict({**cfg, "document": {}})


def test_each_default_lives_in_one_place():
    for path, cls in SECTIONS.items():
        props = _node(path)["properties"]
        for name, default in _fields(cls).items():
            if name == "kind":
                continue
            schema_default = props[name].get("default", msgspec.NODEFAULT)
            if schema_default is not msgspec.NODEFAULT:
                assert default == schema_default, f"{cls.__name__}.{name}"
            elif (default not in (None, msgspec.NODEFAULT, dataclasses.MISSING, {}, "")
                  and cls not in TYPE_ONLY_DEFAULTS):
                # a value the schema does not know: a second place for a default
                assert isinstance(default, msgspec.Struct), f"{cls.__name__}.{name} = {default!r}: not the schema's"
            if cls in TYPE_ONLY_DEFAULTS:
                assert "default" not in props[name], f"{cls.__name__}.{name}: a oneOf branch fills no default"


@pytest.mark.parametrize("configfile", ["config/config.yaml", "config/cpu.yaml", "tests/configs/e2e.yaml",
                                        "tests/configs/long.yaml", "tests/configs/slurm.yaml"])
def test_every_shipped_config_converts(configfile):
    s = load_study([REPO / configfile])
    cfg = load_config([REPO / configfile])
    assert set(s.experiments) == set(cfg["experiments"])
    for name in s.experiments:
        merged = {**cfg.get("loadgen", {}), **cfg["experiments"][name].get("loadgen", {})}
        lg = s.loadgen_for(name)
        for key, value in merged.items():
            assert getattr(lg, key) == value


def test_an_absent_section_takes_the_schema_defaults():
    cfg = load_config([REPO / "tests/configs/e2e.yaml"])
    cfg.pop("loadgen", None)
    cfg.pop("scrape", None)
    s = study.Study.from_dict(cfg)
    assert s.loadgen.request_timeout_s == SCHEMA["properties"]["loadgen"]["properties"]["request_timeout_s"]["default"]
    assert s.scrape.interval_s == SCHEMA["properties"]["scrape"]["properties"]["interval_s"]["default"]


def test_config_readme_is_the_schema_rendered():
    from filledfirst.configdoc import render

    assert (REPO / "config" / "README.md").read_text() == render(), (
        "config/README.md is out of date: python -m filledfirst.configdoc > config/README.md")


def test_every_key_of_the_schema_is_described():
    from filledfirst.configdoc import render

    undocumented = [line for line in render().splitlines() if line.startswith("| `") and line.endswith("|  |")]
    assert not undocumented


def test_an_experiment_spec_is_typed_from_the_document_run_json_keeps():
    import json

    from filledfirst.config import experiment_spec, spec_document

    cfg = load_config([REPO / "config" / "cpu.yaml"])
    s = study.Study.from_dict(cfg)
    doc = spec_document(as_study(cfg), "seq_limit")
    spec = experiment_spec(as_study(cfg), "seq_limit")
    assert spec == study.ExperimentSpec.from_doc(json.loads(json.dumps(doc)))  # as run.json reads back
    assert "server" not in doc["engine"] and spec.engine == s.engine.start()
    assert spec.server == doc["server"] and spec.server["max_num_seqs"] == 8
    assert spec.loadgen == s.loadgen_for("seq_limit") and spec.model == s.model
    assert spec.workload == s.workloads[s.experiments["seq_limit"].workload]
    assert spec.server_spec == study.ServerSpec(model=spec.model, engine=spec.engine, server=spec.server)
    assert study.ExperimentSpec.from_doc(spec.to_doc()) == spec


def test_the_diagnosis_section_only_overrides_the_packages_thresholds(tmp_path):
    base = yaml.safe_load((REPO / "tests/configs/e2e.yaml").read_text())
    assert "properties" not in SCHEMA["properties"]["diagnosis"]  # the defaults live in DiagnosisRules alone

    def loaded(diagnosis):
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump({**base, "diagnosis": diagnosis}))
        return load_study([path]).diagnosis

    rules = loaded({"kv_full_pct": 80})
    assert rules.kv_full_pct == 80 and rules.cap_frac == study.DiagnosisRules().cap_frac
    for bad, expected in [({"kv_full_pcnt": 80}, r"unknown setting\(s\) \['kv_full_pcnt'\]"),
                          ({"cap_frac": 1.5}, r"diagnosis: Expected `float` <= 1"),
                          ({"min_window_scrapes": 0}, r"diagnosis: Expected `int` >= 1")]:
        with pytest.raises(UserError, match=expected):
            loaded(bad)
    with pytest.raises(UserError, match="unknown setting"):  # Snakemake's path: the config as written
        study.Study.from_dict({**load_config([REPO / "tests/configs/e2e.yaml"]), "diagnosis": {"nope": 1}})


def test_config_readme_has_no_empty_section():
    from filledfirst.configdoc import render

    lines = render().splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("#")]
    empty = [lines[a] for a, b in zip(heads, heads[1:] + [len(lines)]) if not any(x.strip() for x in lines[a + 1:b])]
    assert not empty


@pytest.mark.parametrize("configfile, lines",
                         [("config/study.yaml", 320), ("config/cpu.yaml", 170), ("config/config.yaml", 50)])
def test_the_shipped_studies_stay_short(configfile, lines):
    """Each shipped study reads in one sitting: a sweep is one entry, comments say what a key does."""
    assert len((REPO / configfile).read_text().splitlines()) <= lines


def test_both_machines_run_the_one_study_they_extend():
    """config/config.yaml (a GPU) and config/cpu.yaml (a CPU) differ in model, engine, sizes
    and limits' values, never in what is run and what each run is expected to show."""
    from filledfirst.frontier.plan import frontier_plan

    gpu, cpu = (load_study([REPO / "config" / name]) for name in ("config.yaml", "cpu.yaml"))
    base = yaml.safe_load((REPO / "config" / "study.yaml").read_text())
    assert "model" not in base and "engine" not in base
    for machine in (gpu, cpu):
        assert {w for w in machine.workloads if not w.startswith("sweep_")} == set(base["workloads"])
        assert set(machine.experiments) >= set(base["experiments"])
    assert {n: (e.workload, e.section, e.expect) for n, e in gpu.experiments.items() if n in base["experiments"]} \
        == {n: (e.workload, e.section, e.expect) for n, e in cpu.experiments.items() if n in base["experiments"]}
    for name in base["frontiers"]:
        g, c = frontier_plan(gpu, name), frontier_plan(cpu, name)
        own = list(base["frontiers"][name]["settings"])
        assert g.workload_name == c.workload_name and list(g.settings)[:len(own)] == list(c.settings)[:len(own)] == own
        # the same limits relaxed (by how much is the machine's: a CPU's step grows with its load)
        assert sorted((i.parent, i.knob) for i in g.interventions.values()) \
            == sorted((i.parent, i.knob) for i in c.interventions.values())
    assert gpu.model.name != cpu.model.name and gpu.engine.launcher != cpu.engine.launcher


def test_a_file_extends_another_key_by_key(tmp_path):
    from filledfirst.config import config_files

    (tmp_path / "base.yaml").write_text("a: {b: 1, c: [1, 2]}\nd: 3\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "over.yaml").write_text("extends: ../base.yaml\na: {c: [9]}\ne: 4\n")
    assert config_files([tmp_path / "sub" / "over.yaml"]) == {"a": {"b": 1, "c": [9]}, "d": 3, "e": 4}
    (tmp_path / "base.yaml").write_text("extends: sub/over.yaml\n")
    with pytest.raises(UserError, match="base.yaml: extends: sub/over.yaml extends it in turn"):
        config_files([tmp_path / "sub" / "over.yaml"])
    (tmp_path / "sub" / "over.yaml").write_text("extends: nowhere.yaml\n")
    with pytest.raises(UserError, match="nowhere.yaml does not exist"):
        config_files([tmp_path / "sub" / "over.yaml"])
