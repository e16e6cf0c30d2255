"""The project rule: no module outside config, study and run walks the raw config dict, an
experiment's spec document or run.json by string keys, and no module at all walks a
capacity search's search.json so; they read the typed contracts (filledfirst.study,
filledfirst.contracts.runmeta, filledfirst.contracts.search) instead."""

from __future__ import annotations

import re

from conftest import REPO

SRC = REPO / "src" / "filledfirst"
# Indexing a config, spec or run.json document: cfg["x"], config.get("x"), spec["x"],
# run_meta.get("x")... (a name ending so, not one that merely contains it: specs[0]).
RAW_READ = re.compile(r"(?<![A-Za-z])(?:cfg|config|spec|meta)(?:\[|\.get\()")
# The modules that own the raw documents, and model/kv.py, which reads a model's own
# HuggingFace config.json (a foreign format, not ours).
OWNERS = ("config.py", "study.py", "run/", "model/kv.py")
# Indexing a search.json by the keys only it has, whatever the variable is called:
# doc["result"], search["probes"], p.get("run_dir"), result["lo"]... (SearchRecord reads it).
SEARCH_READ = re.compile(r"""(?:\[|\.get\()["'](?:result|probes|bounds|run_dir|reused|lo|hi)["']""")


def raw_reads(pattern: re.Pattern, owners: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(owners):
            continue
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if pattern.search(line):
                found.append(f"src/filledfirst/{rel}:{n}: {line.strip()}")
    return found


def test_no_module_outside_the_owners_reads_a_raw_document():
    assert raw_reads(RAW_READ, OWNERS) == []


def test_no_module_reads_a_raw_search_json():
    assert raw_reads(SEARCH_READ, ()) == []


def test_the_pattern_catches_what_it_is_for():
    for line in ('x = cfg["engine"]', "cfg.get('loadgen')", 'spec["phases"]', 'run_meta["frontier"]',
                 'meta.get("error")', 'self.config["x"]'):
        assert RAW_READ.search(line), line
    for line in ("spec.phases", "meta.frontier.rate", "study.frontiers[name]", "respec['x']", "specs[0]"):
        assert not RAW_READ.search(line), line


def test_the_search_pattern_catches_what_it_is_for():
    for line in ('lo = doc["result"]["lo"]', "search['probes']", 'p.get("run_dir")', 'doc["bounds"]["start"]',
                 'r["reused"]', 'result.get("hi")'):
        assert SEARCH_READ.search(line), line
    for line in ("search.result.lo", "record.probes", 'r["reason"]', 'row["lo_rps"]', 'c.get("ratio")',
                 'probe["rate"]'):
        assert not SEARCH_READ.search(line), line
