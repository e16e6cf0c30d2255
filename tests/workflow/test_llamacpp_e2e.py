"""llama.cpp's real server through the whole pipeline (tests/configs/llamacpp.yaml): the tiny
model written as GGUF by the gguf rule, llama-server started and stopped by the launcher,
a closed-loop sweep at one slot and at four, a capacity search on one slot, then ingest,
diagnosis and the report, as for vLLM. Asserts what holds at any speed: four workers keep
one slot full with requests deferred behind it, and four slots keep none waiting."""

import os
import shutil
import subprocess
from pathlib import Path

import duckdb
import psutil
import pytest

from filledfirst.analysis.diagnosis.labels import Label
from filledfirst.engine.command import llama_server
from filledfirst.engines import llamacpp

from conftest import REPO, snakemake_argv

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def built_server() -> Path:
    path = Path(llama_server())
    if not path.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{llamacpp.COMMAND} missing in CI: `make install` builds it (tools/build_llama_server.py)")
        pytest.skip(f"{llamacpp.COMMAND} not built: `make install` (tools/build_llama_server.py)")
    return path


def test_llamacpp_study_end_to_end(tmp_path, pipeline_env, built_server):
    cfg = tmp_path / "llamacpp.yaml"
    shutil.copy(REPO / "tests" / "configs" / "llamacpp.yaml", cfg)
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run(snakemake_argv(work, cfg, "all"), env=pipeline_env, capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert (work / "data" / "models" / "tiny-qwen2.gguf").stat().st_size > 0

    con = duckdb.connect(str(work / "results" / "filledfirst.duckdb"), read_only=True)
    runs = dict(con.execute("SELECT experiment, status FROM runs WHERE experiment NOT LIKE 'slots/%'").fetchall())
    assert runs == {"one_slot_c4": "ok", "four_slots_c4": "ok"}
    assert {r[0] for r in con.execute("SELECT DISTINCT launcher FROM runs").fetchall()} == {"llamacpp"}
    # every request answered with exactly the sizes asked for, its tokens streamed
    n, ok, exact = con.execute(
        """SELECT count(*), count(*) FILTER (requests.status = 'ok'),
                  count(*) FILTER (prompt_tokens_received = prompt_tokens AND output_tokens_received = output_tokens)
           FROM requests JOIN runs USING (run_id) WHERE experiment IN ('one_slot_c4', 'four_slots_c4')""").fetchall()[0]
    assert n == ok == exact == 480

    diagnosis = {e: (label, engine, notes) for e, label, engine, notes in con.execute(
        "SELECT experiment, label, engine, notes FROM diagnosis").fetchall()}
    assert diagnosis["one_slot_c4"][0] == Label.SEQ_LIMIT.value
    assert diagnosis["four_slots_c4"][0] != Label.SEQ_LIMIT.value
    assert all(engine == "llamacpp" for _, engine, _ in diagnosis.values())
    assert "llamacpp's metrics do not tell KV use" in diagnosis["one_slot_c4"][2]
    # the scheduler's state as llama.cpp's gauges give it: one slot, three deferred behind it
    cap, running, waiting = con.execute(
        """SELECT max(cap), max(running), max(waiting) FROM scheduler_states JOIN runs USING (run_id)
           WHERE experiment = 'one_slot_c4'""").fetchall()[0]
    assert (cap, running, waiting) == (1, 1, 3)
    # each server started with the slots asked for, and stopped
    for experiment, slots in (("one_slot_c4", "1"), ("four_slots_c4", "4")):
        log = (work / "results" / "runs" / experiment / "server.log").read_text()
        assert f"n_slots = {slots}" in log
    assert not [p for p in psutil.process_iter(["cmdline", "cwd"])
                if (p.info["cmdline"] or [""])[0] == str(built_server) and p.info["cwd"] == str(work)]

    # the search on one slot: probes run, a knee bracketed, its probes labelled
    search = con.execute("SELECT probes, reason, lo_rps, hi_rps FROM frontiers WHERE setting = 'one'").fetchall()[0]
    assert search[0] >= 1 and search[1] in ("converged", "budget", "decided") and (search[2] or search[3])
    assert con.execute("SELECT count(*) FROM diagnosis WHERE experiment LIKE 'slots/one/p%'").fetchall()[0][0] \
        == search[0]

    # the report: the seed's Ollama sweep beside ours, with what filled first and what the
    # engine's metrics cannot tell
    html = (work / "reports" / "report.html").read_text()
    assert "Concurrency sweep on llama.cpp" in html and "concurrency (reference)" in html and "8.57 s" in html
    assert "what filled first" in html and "active-sequence limit" in html
    assert "llamacpp's metrics do not tell KV use" in html.replace("&#x27;", "'")

