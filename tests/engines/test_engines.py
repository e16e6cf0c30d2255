"""The engines' metric mappings (filledfirst.engines): each engine's names read as the
engine-neutral signals, on pages in its format. vLLM's are recorded from the real engine
elsewhere (tests/loadgen, the end-to-end tests); SGLang's and llama.cpp's here are written
from their source (tests/engines/pages say from which files), since no SGLang server can run
on these machines and llama.cpp's server is not built by the tests yet. A diagnosis of each
engine's runs: the synthetic runs of tests/helpers/synthetic_db in that engine's names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from filledfirst.engines import ENGINES, llamacpp, sglang, vllm
from filledfirst.metrics import latest_gauges, parse_metrics

from conftest import REPO
from helpers import synthetic_db as sdb

PAGES = Path(__file__).parent / "pages"
by_name = {m.METRICS.name: m.METRICS for m in (vllm, sglang, llamacpp)}.__getitem__
VLLM_PAGE = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE python_gc_objects_collected counter
python_gc_objects_collected_total{generation="0"} 1.0
"""


def test_no_engine_name_outside_its_engine_module():
    """The diagnosis, the search and the report read signals: an engine's names live in its module."""
    src = REPO / "src" / "filledfirst"
    prefixes = [e.prefix for e in ENGINES]
    found = []
    for path in src.rglob("*.py"):
        if path.parent.name == "engines":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if any(re.search(rf"['\"`]{re.escape(p)}[a-z_]", line) for p in prefixes):
                found.append(f"{path.relative_to(src)}:{i}")
    assert not found


@pytest.mark.parametrize("engine, page, running, waiting, kv_pct", [
    ("vllm", VLLM_PAGE, 3, 0, 25.0),
    ("sglang", (PAGES / "sglang.prom").read_text(), 8, 5, 40.0),
    ("llamacpp", (PAGES / "llamacpp.prom").read_text(), 4, 7, None),  # no KV gauge
])
def test_a_page_is_read_as_its_engines_signals(engine, page, running, waiting, kv_pct):
    samples = parse_metrics(page, 1.0)
    assert samples and all(s.metric.startswith(by_name(engine).prefix) for s in samples)  # python_* left out
    gauges = latest_gauges(samples)
    assert (gauges.running, gauges.waiting, gauges.kv_pct) == (running, waiting, kv_pct)


def test_a_page_of_no_known_engine_gives_no_samples():
    assert parse_metrics("# TYPE http_requests_total counter\nhttp_requests_total 3\n", 1.0) == []


def test_what_each_engine_cannot_tell_is_said():
    assert not by_name("vllm").cannot
    assert any("KV use" in c for c in by_name("llamacpp").cannot)
    assert any("steps" in c for c in by_name("sglang").cannot)


# The synthetic runs' vLLM names, as each engine spells the same signal.
RENAMED = {
    "sglang": {sdb.RUNNING: "sglang:num_running_reqs", sdb.WAITING: "sglang:num_queue_reqs",
               sdb.KV: "sglang:token_usage", "vllm:num_preemptions_total": "sglang:num_retracted_requests_total"},
    "llamacpp": {sdb.RUNNING: "llamacpp:requests_processing", sdb.WAITING: "llamacpp:requests_deferred"},
}


def _as(engine: str, run: dict) -> dict:
    """The run in `engine`'s names; a signal the engine does not have is left out."""
    names = RENAMED[engine]
    samples = [(t, names[m], v, *rest) for t, m, v, *rest in run["samples"] if m in names]
    labels = {n: "model_name=m,tp_rank=0" for n in names.values()} if engine == "sglang" else {n: "" for n in
                                                                                                 names.values()}
    return run | {"samples": samples, "labels": labels}


@pytest.mark.parametrize("engine", ["sglang", "llamacpp"])
def test_a_full_cap_is_named_on_every_engine(tmp_path, engine):
    """Its cap (SGLang's max_running_requests, llama.cpp's --parallel slots) full, the queue
    growing behind it: the active-sequence limit, as on vLLM."""
    reqs = sdb.queue(sdb.every(0.1, 200), 1.2, 8)
    run = {"run_id": engine, "cap": 8, "requests": reqs, "samples": sdb.gauges(reqs, 32, lambda n: 1.5 * n)}
    d = sdb.run_of(tmp_path, **_as(engine, run))
    assert d["label"] == "active-sequence limit", d["clue"]
    assert d["running_at_cap_share"] > 0.9 and d["waiting_share"] > 0.9


def test_kv_pressure_is_named_on_sglang_and_cannot_be_on_llamacpp(tmp_path):
    d = sdb.run_of(tmp_path, **_as("sglang", sdb.kv_pressure_run("sg")))
    assert d["label"] == "KV-capacity pressure", d["clue"]
    assert d["window_preemptions"] == 4  # retractions
    d = sdb.run_of(tmp_path, **_as("llamacpp", sdb.kv_pressure_run("lc")))
    assert d["label"] != "KV-capacity pressure"
    assert d["kv_full_share"] is None and "llamacpp's metrics do not tell KV use" in d["notes"]
