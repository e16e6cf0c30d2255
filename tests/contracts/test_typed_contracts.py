"""The project rule: the files that pass between stages (run.json, search.json, a
schedule's stats, a trace's stats) are written from their typed records and read through
their one decoder, all in filledfirst.contracts; nothing else parses or writes JSON but
the foreign formats listed here. Checked on what the code calls (its syntax tree), not on
what a variable is called; and every file as a writer writes it decodes to its record and
encodes back to the same document (tests/helpers/contracts.py, also run on every run.json
and search.json the run and search tests write)."""

from __future__ import annotations

import ast
import re

import pytest

from filledfirst import study
from filledfirst.contracts.document import settled
from filledfirst.contracts.runmeta import ModelInfo
from filledfirst.contracts.stats import Placement, ScheduleStats, stats_path

from conftest import REPO
from helpers.contracts import assert_round_trips

SRC = REPO / "src" / "filledfirst"
CONTRACTS = "contracts/"
# Modules that parse JSON which is no contract of ours, and what it is.
FOREIGN_JSON = {
    "loadgen/stream.py": "the server's streamed chunks",
    "engine/server.py": "vLLM's /version and /v1/models answers",
    "model/kv.py": "a model's HuggingFace config.json",
    "store/study_parts.py": "table study_parts: the config's parts, typed by filledfirst.study.Part",
    "analysis/diagnosis": "table diagnosis_rules: the config's diagnosis section, typed by DiagnosisRules",
}
PARSERS = {"json.load", "json.loads", "msgspec.json.decode", "msgspec.json.Decoder"}
WRITERS = {"atomic.write_json", "json.dump"}


def _dotted(node: ast.expr) -> str:
    """`a.b.c` of an attribute chain on a name ("" for anything else)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def calls(names: set[str], root=SRC) -> list[tuple[str, int, str]]:
    """(module, line, name) of every call of one of `names` (`json.loads`, ...), however it
    was imported: `json.loads(t)`, `loads(t)` after `from json import loads`, ..."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {}  # a local name -> what it stands for, dotted
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                imported |= {a.asname or a.name: a.name for a in node.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and (name := _dotted(node.func)):
                head, _, rest = name.partition(".")
                full = ".".join(filter(None, [imported.get(head, head), rest])).removeprefix("filledfirst.")
                if full in names:
                    found.append((path.relative_to(root).as_posix(), node.lineno, name))
    return found


def test_only_the_contracts_and_the_foreign_formats_parse_json():
    outside = [f"src/filledfirst/{rel}:{line}: {name}" for rel, line, name in calls(PARSERS)
               if not rel.startswith((CONTRACTS, *FOREIGN_JSON))]
    assert outside == []


def test_only_the_contracts_write_json_files():
    outside = [f"src/filledfirst/{rel}:{line}: {name}" for rel, line, name in calls(WRITERS)
               if not rel.startswith(CONTRACTS) and rel != "atomic.py"]
    assert outside == []


def test_the_check_sees_every_spelling(tmp_path):
    (tmp_path / "x.py").write_text(
        "import json\nfrom json import loads as parse\nfrom filledfirst import atomic\nimport msgspec\n"
        "a = json.loads(t)\nb = parse(t)\nc = msgspec.json.decode(t)\natomic.write_json(d, p)\n"
        "e = meta.loads(t)\nf = runmeta.decode(d)\n")
    assert [line for _, line, _ in calls(PARSERS, tmp_path)] == [5, 6, 7]
    assert [line for _, line, _ in calls(WRITERS, tmp_path)] == [8]


def test_run_json_keeps_the_model_section_whole():
    """run.json's model is the config's model section: a key the config gains is kept."""
    assert set(ModelInfo.__struct_fields__) == set(study.Model.__struct_fields__)


@pytest.mark.parametrize("relative", [False, True])
def test_a_synthetic_schedules_stats_round_trip(tmp_path, relative):
    from filledfirst.workloads.synthetic import write_synthetic_schedule

    workload = {"phases": [{"role": "r", "count": 5, "prompt_tokens": 10, "output_tokens": 4, "interval_s": 0.5}]}
    placed = Placement(key="phases[0].interval_s", role="r", of="f/s", knee_rps=1.0, reason="converged",
                       search="s.json", times=2.0, rate_rps=2.0, interval_s=0.5)
    extra = {"relative": [placed]} if relative else None
    out = tmp_path / "s.parquet"
    written = write_synthetic_schedule(workload, out, extra)
    doc = assert_round_trips(stats_path(out))
    assert "window" not in doc and ("relative" in doc) == relative
    read = ScheduleStats.load(stats_path(out))
    assert read == settled(written) and read.window is None and read.requests == 5


def test_a_trace_windows_and_a_traces_stats_round_trip(tmp_path):
    from filledfirst.trace.stats import trace_stats
    from filledfirst.trace.subsample import subsample_to_parquet

    csv = tmp_path / "t.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2024-05-10 00:00:{s:02d}+00:00,{100 + s},{10 + s}\n" for s in range(40)))
    out = tmp_path / "w.parquet"
    written = subsample_to_parquet(csv, out, minutes=0.5, keep_every=2)
    doc = assert_round_trips(stats_path(out))
    assert doc["window"]["requests"] == 30 and "phases" not in doc
    assert ScheduleStats.load(stats_path(out)) == settled(written)
    trace_stats(csv, tmp_path / "trace.json")
    assert assert_round_trips(tmp_path / "trace.json")["requests"] == 40


# The config travels as a dict (Snakemake's `config`); outside the modules that own it,
# it is read typed (filledfirst.study.Study): cfg["x"], config.get("x"), ...
RAW_CONFIG_READ = re.compile(r"(?<![A-Za-z])(?:cfg|config)(?:\[|\.get\()")
CONFIG_OWNERS = ("config.py", "study.py", "run/", "model/kv.py")  # kv.py: a model's own config.json


def test_no_module_outside_the_owners_reads_the_raw_config():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if not rel.startswith(CONFIG_OWNERS):
            found += [f"src/filledfirst/{rel}:{n}: {line.strip()}"
                      for n, line in enumerate(path.read_text().splitlines(), start=1) if RAW_CONFIG_READ.search(line)]
    assert found == []
