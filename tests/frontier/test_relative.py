"""Workload rates placed relative to a measured knee (`{of: <frontier>/<setting>, times}`):
resolution from search.json, the CLI's record in .stats.json, validation, error cases."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import msgspec
import polars as pl
import pytest

from filledfirst.cli import main
from filledfirst.config import deep_merge, load_config, load_study, validate_config
from filledfirst.errors import UserError
from filledfirst.frontier.probes import trace_kept_rate
from filledfirst.frontier.relative import (
    KneeFile,
    knee,
    knee_searches,
    load_knees,
    resolve_synthetic,
    resolve_time_scale,
    trace_scale_resolver,
)
from filledfirst.study import RelativeRate, SyntheticWorkload, TraceWorkload
from filledfirst.trace.subsample import subsample_to_parquet
from filledfirst.workloads.synthetic import synthetic_schedule

from conftest import REPO
from helpers.searches import search_record

CONFIGS = [REPO / "tests" / "configs" / f for f in ("e2e.yaml", "frontier.yaml", "relative.yaml")]


def write_search(path: Path, **kw) -> Path:
    """A search.json (`search_record`'s keywords) at `path`."""
    search_record(**kw).write(path)
    return path


@pytest.fixture
def cfg():
    return copy.deepcopy(load_config(CONFIGS))


# --- synthetic ------------------------------------------------------------------------


def test_a_relative_phase_arrives_at_times_the_knee_the_others_stay():
    spec = msgspec.convert({"kind": "synthetic", "phases": [
        {"role": "bg", "count": 10, "rate": {"of": "knee/default", "times": 2.0},
         "prompt_tokens": 10, "output_tokens": 5},
        {"role": "probe", "count": 3, "start_s": 1.0, "interval_s": 0.25, "prompt_tokens": 10, "output_tokens": 5},
    ]}, SyntheticWorkload)
    knees = {"knee/default": KneeFile(Path("s.json"), search_record(lo=4.0))}
    resolved_spec, resolved = resolve_synthetic(spec, knees)
    assert resolved_spec.phases[0] == msgspec.structs.replace(spec.phases[0], interval_s=pytest.approx(1 / 8),
                                                              rate=None)
    assert resolved_spec.phases[1] == spec.phases[1]
    assert spec.phases[0].rate == RelativeRate(of="knee/default", times=2.0)  # unchanged
    assert [r.to_doc() for r in resolved] == [{
        "key": "phases[0].rate", "role": "bg", "of": "knee/default", "knee_rps": 4.0, "reason": "converged",
        "search": "s.json", "times": 2.0, "rate_rps": 8.0, "interval_s": 0.125}]
    times = synthetic_schedule(resolved_spec).filter(pl.col("role") == "bg")["t_offset_s"].to_list()
    assert times == pytest.approx([k / 8 for k in range(10)])


def test_an_unresolved_phase_is_not_scheduled():
    spec = {"phases": [{"role": "bg", "count": 2, "rate": {"of": "knee/default", "times": 2.0},
                        "prompt_tokens": 10, "output_tokens": 5}]}
    with pytest.raises(UserError, match="relative to the knee of knee/default: resolve it first"):
        synthetic_schedule(spec)


def test_workload_synth_records_what_it_resolved(tmp_path, monkeypatch, capsys):
    """The knee comes from the search's result where the study's plan puts it (under the
    working directory, as Snakemake runs the job); a missing one is named."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "twice.parquet"
    argv = ["workload", "synth", *sum((["--config", str(c)] for c in CONFIGS), []),
            "--workload", "twice_knee", "--out", str(out)]
    assert main(argv) == 2
    assert "results/frontiers/knee/default/search.json missing" in capsys.readouterr().err
    search = write_search(Path("results/frontiers/knee/default/search.json"), lo=3.0)
    assert main(argv) == 0
    stats = json.loads(Path(str(out) + ".stats.json").read_text())
    (rel,) = stats["relative"]
    assert rel["of"] == "knee/default" and rel["knee_rps"] == 3.0 and rel["times"] == 2.0
    assert rel["rate_rps"] == 6.0 and rel["interval_s"] == pytest.approx(1 / 6) and rel["reason"] == "converged"
    assert rel["search"] == str(search)
    t = pl.read_parquet(out)["t_offset_s"]
    assert t.len() == 20 and (t.diff().drop_nulls() - 1 / 6).abs().max() < 1e-9


def test_absolute_workloads_are_unchanged_and_need_no_knee(tmp_path):
    out = tmp_path / "light.parquet"
    argv = ["workload", "synth", *sum((["--config", str(c)] for c in CONFIGS), []), "--workload", "paced",
            "--out", str(out)]
    assert main(argv) == 0
    assert "relative" not in json.loads(Path(str(out) + ".stats.json").read_text())


def test_workload_synth_without_the_knee_file_names_the_search(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["workload", "synth", *sum((["--config", str(c)] for c in CONFIGS), []), "--workload", "twice_knee",
            "--out", str(tmp_path / "x.parquet")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "relative to knees not searched yet: results/frontiers/knee/default/search.json missing" in err
    assert not (tmp_path / "x.parquet").exists()


@pytest.mark.parametrize("kw, expected", [
    (dict(lo=None, hi=1.0, reason="breaks_at_start"),
     r"the capacity search knee/default \(.*search.json\) found no knee: no rate held, it ended with "
     r"breaks_at_start \(even the start rate 1 req/s broke the SLO\)"),
    (dict(lo=None, hi=None, reason="probe_failed", error="server never became healthy"),
     r"found no knee: no rate held, it ended with probe_failed: server never became healthy"),
])
def test_a_search_without_a_knee_is_a_clear_error(tmp_path, kw, expected):
    knees = load_knees([write_search(tmp_path / "search.json", **kw)])
    with pytest.raises(UserError, match=expected):
        knee("knee/default", knees)


def test_a_knee_file_that_is_not_a_search_is_refused(tmp_path):
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(UserError, match="is not a capacity search's search.json"):
        load_knees([tmp_path / "bad.json"])
    with pytest.raises(UserError, match="does not exist .has the capacity search run"):
        load_knees([tmp_path / "missing.json"])


# --- trace ----------------------------------------------------------------------------


def trace_csv(path: Path, n: int = 200, gap_ms: int = 500) -> Path:
    t0 = datetime(2024, 5, 12, tzinfo=timezone.utc)
    rows = [((t0 + timedelta(milliseconds=i * gap_ms)).strftime("%Y-%m-%d %H:%M:%S.%f") + "+00:00", 100, 10)
            for i in range(n)]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{t},{p},{o}\n" for t, p, o in rows))
    return path


def test_a_relative_time_scale_offers_times_the_knee(tmp_path):
    csv = trace_csv(tmp_path / "t.csv")  # 2 rows/s; every 4th: 0.5 kept per trace second
    knees = load_knees([write_search(tmp_path / "search.json", setting="seq2", lo=2.0)])
    out = tmp_path / "s.parquet"
    stats = subsample_to_parquet(csv, out, minutes=1.0, keep_every=4,
                                 relative=trace_scale_resolver("knee/seq2", 1.5, knees))
    (rel,) = stats.relative
    assert rel.kept_per_s == pytest.approx(0.5) and rel.rate_rps == 3.0
    assert rel.time_scale == pytest.approx(0.5 / 3.0) == stats.time_scale
    # The density the search reads back from these stats is the window's, whatever the scale.
    assert trace_kept_rate(stats) == pytest.approx(0.5)
    assert stats.requests / stats.duration_s == pytest.approx(3.0)
    gaps = pl.read_parquet(out)["t_offset_s"].diff().drop_nulls()
    assert (gaps - 1 / 3.0).abs().max() < 1e-9
    # the same mapping as a search's trace probe at that rate
    assert resolve_time_scale("knee/seq2", 1.5, knees, 0.5)[0] == pytest.approx(0.5 / 3.0)


def test_trace_subsample_cli_takes_a_knee_and_records_it(tmp_path):
    csv = trace_csv(tmp_path / "t.csv")
    search = write_search(tmp_path / "search.json", setting="seq2", lo=1.0)
    out = tmp_path / "s.parquet"
    assert main(["trace", "subsample", str(csv), "--minutes", "1", "--keep-every", "2", "--search", str(search),
                 "--times", "0.5", "--out", str(out)]) == 0
    stats = json.loads(Path(str(out) + ".stats.json").read_text())
    assert stats["relative"][0]["of"] == "knee/seq2" and stats["time_scale"] == pytest.approx(1.0 / 0.5)


def test_trace_subsample_cli_refuses_half_a_knee(tmp_path, capsys):
    csv = trace_csv(tmp_path / "t.csv")
    assert main(["trace", "subsample", str(csv), "--minutes", "1", "--times", "2", "--out",
                 str(tmp_path / "s.parquet")]) == 2
    assert "--search SEARCH_JSON and --times X go together" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: not both
        main(["trace", "subsample", str(csv), "--minutes", "1", "--time-scale", "2", "--search", "x.json",
              "--times", "2", "--out", str(tmp_path / "s.parquet")])


def test_a_trace_without_a_knee_fails_before_writing(tmp_path):
    csv = trace_csv(tmp_path / "t.csv")
    knees = load_knees([write_search(tmp_path / "search.json", lo=None, hi=1.0, reason="breaks_at_start")])
    with pytest.raises(UserError, match="knee/default .* found no knee"):
        subsample_to_parquet(csv, tmp_path / "s.parquet", minutes=1.0,
                             relative=trace_scale_resolver("knee/default", 1.0, knees))
    assert not (tmp_path / "s.parquet").exists()


# --- config: schema, types, cross-references -------------------------------------------


def test_the_config_types_relative_rates():
    s = load_study(CONFIGS)
    twice, azure = s.workloads["twice_knee"], s.workloads["azure_half_knee"]
    assert isinstance(twice, SyntheticWorkload) and isinstance(azure, TraceWorkload)
    assert twice.phases[0].rate == RelativeRate(of="knee/default", times=2.0)
    assert azure.rate == RelativeRate(of="knee/seq2", times=0.5)
    assert (azure.rate.frontier, azure.rate.setting) == ("knee", "seq2")
    assert s.workloads["paced"].phases[0].interval_s == 0.5  # absolute ones stay numbers
    assert knee_searches(twice) == ["knee/default"] and knee_searches(azure) == ["knee/seq2"]
    assert knee_searches(s.workloads["paced"]) == []


@pytest.mark.parametrize("mutate, expected", [
    (lambda c: c["workloads"]["twice_knee"]["phases"][0].update(rate={"of": "nope/default", "times": 2}),
     "workloads.twice_knee.phases[0].rate.of: 'nope/default': no frontier 'nope' in frontiers (['knee'])"),
    (lambda c: c["workloads"]["azure_half_knee"].update(rate={"of": "knee/seq9", "times": 2}),
     "workloads.azure_half_knee.rate.of: 'knee/seq9': frontier 'knee' has no setting 'seq9' "
     "(['default', 'seq2'])"),
    (lambda c: c["frontiers"]["knee"].update(workload="twice_knee"),
     "frontiers.knee.workload: 'twice_knee' is placed relative to a knee (knee/default): a search's shape "
     "must have absolute rates"),
    (lambda c: c.pop("frontiers"),
     "workloads.twice_knee.phases[0].rate.of: 'knee/default': no frontier 'knee' in frontiers ([])"),
    (lambda c: c["workloads"]["twice_knee"]["phases"][0].update(interval_s=0.1),
     "workloads.twice_knee.phases[0]: rate and interval_s both set its rate: keep one"),
    (lambda c: c["workloads"]["azure_half_knee"].update(time_scale=0.5),
     "workloads.azure_half_knee: rate and time_scale both set its rate: keep one"),
])
def test_relative_rates_must_name_an_existing_search(cfg, mutate, expected):
    mutate(cfg)
    with pytest.raises(UserError) as err:
        validate_config(cfg)
    assert expected in str(err.value)


@pytest.mark.parametrize("value", [{"of": "knee/default"}, {"of": "knee", "times": 2}, {"of": "knee/default",
                                   "times": 0}, {"of": "knee/default", "times": 2, "extra": 1}, -1])
def test_the_schema_takes_of_and_times(cfg, value):
    cfg["workloads"]["twice_knee"]["phases"][0]["rate"] = value
    with pytest.raises(UserError, match=r"workloads.twice_knee"):
        validate_config(cfg)


@pytest.mark.parametrize("key, value, expected", [
    ("rate", {"of": "knee/seq2"}, "workloads.azure_half_knee.rate: 'times' is a required property"),
    ("time_scale", 0, "workloads.azure_half_knee.time_scale: 0 is less than or equal to the minimum of 0"),
    ("rate", {"of": "knee/seq2", "times": -1}, "workloads.azure_half_knee.rate.times: -1 is less than or equal"),
])
def test_a_trace_workloads_error_is_its_own_kinds(cfg, key, value, expected):
    """Not "kind: 'synthetic' was expected": the complaint of the trace branch."""
    cfg["workloads"]["azure_half_knee"].pop("rate")
    cfg["workloads"]["azure_half_knee"][key] = value
    with pytest.raises(UserError) as err:
        validate_config(cfg)
    assert expected in str(err.value)


def test_trace_subsample_of_a_config_workload(tmp_path, capsys, monkeypatch):
    """`trace subsample --config --workload` takes every window setting from the config (as
    `workload synth` does), a relative time scale from the search its `of` names; the
    result is the schedule the flags would give."""
    import yaml

    csv = trace_csv(tmp_path / "t.csv")
    monkeypatch.chdir(tmp_path)
    write_search(Path("results/frontiers/knee/seq2/search.json"), setting="seq2", lo=1.0)
    cfg = yaml.safe_load((REPO / "tests" / "configs" / "e2e.yaml").read_text())
    cfg = deep_merge(cfg, yaml.safe_load((REPO / "tests" / "configs" / "frontier.yaml").read_text()))
    cfg["workloads"]["w_abs"] = {"kind": "trace", "trace": "azure2023_conv", "minutes": 1, "keep_every": 2,
                                 "time_scale": 0.5}
    cfg["workloads"]["w_rel"] = {"kind": "trace", "trace": "azure2023_conv", "minutes": 1, "keep_every": 2,
                                 "rate": {"of": "knee/seq2", "times": 0.5}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    by_config, by_flags = tmp_path / "a.parquet", tmp_path / "b.parquet"
    assert main(["trace", "subsample", str(csv), "--config", str(path), "--workload", "w_abs",
                 "--out", str(by_config)]) == 0
    assert main(["trace", "subsample", str(csv), "--minutes", "1", "--keep-every", "2", "--time-scale", "0.5",
                 "--max-model-len", str(cfg["model"]["max_model_len"]), "--out", str(by_flags)]) == 0
    assert pl.read_parquet(by_config).equals(pl.read_parquet(by_flags))
    rel = tmp_path / "r.parquet"
    assert main(["trace", "subsample", str(csv), "--config", str(path), "--workload", "w_rel",
                 "--out", str(rel)]) == 0
    stats = json.loads(Path(str(rel) + ".stats.json").read_text())
    assert stats["relative"][0]["of"] == "knee/seq2" and stats["time_scale"] == pytest.approx(1.0 / 0.5)
    # the config is the one place the window comes from
    assert main(["trace", "subsample", str(csv), "--config", str(path), "--workload", "w_abs", "--minutes", "2",
                 "--out", str(rel)]) == 2
    assert "drop --minutes" in capsys.readouterr().err
    assert main(["trace", "subsample", str(csv), "--config", str(path), "--workload", "w_abs", "--keep-every", "2",
                 "--out", str(rel)]) == 2
    assert "drop --keep-every" in capsys.readouterr().err
    assert main(["trace", "subsample", str(csv), "--config", str(path), "--workload", "paced", "--out",
                 str(rel)]) == 2
    assert "is synthetic" in capsys.readouterr().err
    Path("results/frontiers/knee/seq2/search.json").unlink()
    assert main(["trace", "subsample", str(csv), "--config", str(path), "--workload", "w_rel", "--out",
                 str(rel)]) == 2
    assert "knee/seq2" in capsys.readouterr().err
