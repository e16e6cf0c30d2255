"""`filledfirst replay` against a real vLLM CPU server the pipeline did not start."""

import json
import os
import subprocess
import sys

import duckdb
import pyarrow.parquet as pq
import pytest

from filledfirst.engine.command import build_command
from filledfirst.engine.server import VllmServer, free_port
from filledfirst.store.ingest import ingest
from filledfirst.study import Model, TokenIds

from conftest import build_test_model, engine_overlay
from helpers.schedules import probe_schedule

pytestmark = pytest.mark.engine

KEY = "sk-planted-4f1e9a77c2"  # must never reach a file we write


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("external")
    build_test_model(root / "model")
    model = Model(name="tiny", source="tiny", path=str(root / "model"), dtype="float32", max_model_len=2048,
                  prompt_token_ids=TokenIds(low=10, high=20))
    port = free_port("127.0.0.1")
    cmd = build_command(
        launcher="cpu", model=model, host="127.0.0.1", port=port, seed=0, extra_env={},
        settings={"max_num_seqs": 8, "enforce_eager": True, "kv_cache_space_gib": 1,
                  "extra_args": ["--api-key", KEY]} | engine_overlay().get("engine", {}).get("server", {}),
    )
    with VllmServer(cmd, host="127.0.0.1", port=port, log_path=root / "server.log", startup_timeout_s=400,
                    nice=10) as s:
        yield s


def schedule(path, n=12):
    return probe_schedule(path, n, gap_s=0.2, prompt=50, output=16)


def replay(server, tmp_path, name, env_extra, prompt_args=("--token-ids", "10", "2050")):
    out = tmp_path / name
    proc = subprocess.run(
        [sys.executable, "-m", "filledfirst", "replay", "--url", server.base_url,
         "--schedule", str(schedule(tmp_path / "s.parquet")), "--out", str(out),
         "--model", "tiny", *prompt_args, "--name", name, "--api-key-env", "FF_TEST_KEY",
         "--no-progress"],
        env={**os.environ, **env_extra}, capture_output=True, text=True, timeout=300,
    )
    return proc, out


def test_replay_against_an_external_endpoint(server, tmp_path):
    proc, out = replay(server, tmp_path, "external", {"FF_TEST_KEY": KEY})
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "ok" and meta["server"]["launcher"] == "external"
    assert meta["request_status_counts"] == {"ok": 12}
    db = tmp_path / "f.duckdb"
    ingest([out], db)
    con = duckdb.connect(str(db), read_only=True)
    # the endpoint's own /metrics were scraped (vLLM serves them without the key)
    assert con.execute("SELECT count(*) FROM samples WHERE metric = 'vllm:num_requests_running'").fetchall()[0][0] > 0
    assert con.execute("SELECT sum(output_tokens_received) FROM requests").fetchall()[0][0] == 12 * 16
    con.close()
    # The key came from the environment and went nowhere else.
    for path in [*out.iterdir(), db]:
        assert KEY.encode() not in path.read_bytes(), f"API key leaked into {path.name}"
    assert KEY not in proc.stderr + proc.stdout


def test_a_wrong_key_fails_before_the_schedule_starts(server, tmp_path):
    """vLLM guards /v1/models with the key: the check before the schedule sees the 401."""
    proc, out = replay(server, tmp_path, "badkey", {"FF_TEST_KEY": "not-the-key"})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"filledfirst: error: {server.base_url} refused the API key (HTTP 401 from /v1/models)" in proc.stderr
    assert not out.exists() and "not-the-key" not in proc.stderr


def test_missing_key_variable_is_a_clear_error(server, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FF_TEST_KEY"}
    proc = subprocess.run(
        [sys.executable, "-m", "filledfirst", "replay", "--url", server.base_url,
         "--schedule", str(schedule(tmp_path / "s.parquet")), "--out", str(tmp_path / "x"),
         "--model", "tiny", "--token-ids", "10", "2050", "--api-key-env", "FF_TEST_KEY"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2 and "FF_TEST_KEY" in proc.stderr and "not set" in proc.stderr


def in_flight_max(reqs):
    events = sorted([(r["t_sent"], 1) for r in reqs] + [(r["t_done"], -1) for r in reqs])
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


def test_closed_loop_keeps_exactly_n_in_flight(server, tmp_path):
    out = tmp_path / "closed"
    proc = subprocess.run(
        [sys.executable, "-m", "filledfirst", "replay", "--url", server.base_url,
         "--schedule", str(schedule(tmp_path / "s.parquet", n=20)), "--out", str(out),
         "--model", "tiny", "--token-ids", "10", "2050", "--closed", "4", "--api-key-env", "FF_TEST_KEY",
         "--no-progress"],
        env={**os.environ, "FF_TEST_KEY": KEY}, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reqs = pq.read_table(out / "requests.parquet").to_pylist()
    assert [r["status"] for r in reqs] == ["ok"] * 20
    assert in_flight_max(reqs) == 4
    # a worker sends its next request right after its last one ended
    assert all(r["t_sent"] - r["t_scheduled"] < 0.05 for r in reqs)
    samples = pq.read_table(out / "samples.parquet").to_pylist()
    running = [s["value"] for s in samples if s["metric"] == "vllm:num_requests_running"]
    assert running and max(running) <= 4


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_text_prompts_for_servers_that_refuse_token_ids(server, tmp_path, api):
    """Text mode is approximate in prompt size (the usage is recorded), exact in output size;
    chat's opening role-only chunk must not count as the first token."""
    proc, out = replay(server, tmp_path, f"text-{api}", {"FF_TEST_KEY": KEY},
                       prompt_args=("--prompt", "text", "--api", api))
    assert proc.returncode == 0, proc.stderr[-3000:]
    reqs = pq.read_table(out / "requests.parquet").to_pylist()
    assert len(reqs) == 12 and all(r["status"] == "ok" for r in reqs), reqs[0]
    for r in reqs:
        assert r["output_tokens_received"] == 16 and r["reasoning_tokens"] == 0
        assert r["prompt_tokens_received"] >= 50  # one or more tokens per word
        assert r["t_first_content"] == r["t_first_token"] > r["t_sent"]
        # vLLM's per-request timings ride on the final usage chunk of both APIs
        assert r["server_queue_ms"] is not None and r["server_prefill_ms"] is not None, r
        assert r["server_queue_ms"] + r["server_prefill_ms"] <= (r["t_first_token"] - r["t_sent"]) * 1000 + 1
    toks = pq.read_table(out / "tokens.parquet").to_pylist()
    assert sum(t["n"] for t in toks) == 12 * 16


def test_an_experiment_against_an_endpoint_the_study_does_not_start(server, tmp_path):
    """`server.url` in an experiment: the pipeline starts no vLLM, replays against the
    endpoint, scrapes its /metrics, and the key stays in the environment."""
    import yaml

    from conftest import REPO, snakemake_argv

    cfg = yaml.safe_load((REPO / "tests" / "configs" / "e2e.yaml").read_text())
    cfg["model"]["name"] = "tiny"  # the endpoint's served model name
    cfg["experiments"] = {
        "deployed": {"workload": "light", "server": {"url": server.base_url + "/", "api_key_env": "FF_TEST_KEY"}},
    }
    config = tmp_path / "external.yaml"
    config.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "FF_TEST_KEY": KEY,
           "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(snakemake_argv(tmp_path, config, "results/filledfirst.duckdb"), env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((tmp_path / "results" / "runs" / "deployed" / "run.json").read_text())
    assert meta["status"] == "ok" and meta["server"]["launcher"] == "external"
    assert meta["server"]["url"] == server.base_url and meta["server"]["api_key_env"] == "FF_TEST_KEY"
    assert meta["versions"]["vllm"]  # read from the endpoint's /version
    con = duckdb.connect(str(tmp_path / "results" / "filledfirst.duckdb"), read_only=True)
    n_scheduled = sum(phase["count"] for phase in cfg["workloads"]["light"]["phases"])
    assert con.execute("SELECT count(*) FROM requests WHERE status = 'ok'").fetchall()[0][0] == n_scheduled
    assert con.execute("SELECT count(*) FROM samples WHERE metric = 'vllm:num_requests_running'").fetchall()[0][0] > 0
    assert con.execute("SELECT count(*) FROM diagnosis").fetchall()[0][0] == 1
    con.close()
    assert "starting vLLM" not in (tmp_path / "results" / "logs" / "run-deployed.log").read_text()
    for path in [p for p in tmp_path.rglob("*") if p.is_file()]:  # runs, logs, database, .snakemake
        assert KEY.encode() not in path.read_bytes(), f"API key leaked into {path}"
    assert KEY not in proc.stderr + proc.stdout


def test_two_worker_processes_give_what_one_gives_on_the_real_engine(server, tmp_path):
    """The same schedule with one load-generator process and with two: the same requests,
    each answered in full with vLLM's timings, and the same diagnosis."""
    from filledfirst.analysis.diagnosis import write_diagnosis
    from filledfirst.study import DiagnosisRules

    runs = {}
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}"
        proc = subprocess.run(
            [sys.executable, "-m", "filledfirst", "replay", "--url", server.base_url,
             "--schedule", str(schedule(tmp_path / "s.parquet", n=24)), "--out", str(out),
             "--model", "tiny", "--token-ids", "10", "2050", "--api-key-env", "FF_TEST_KEY",
             "--name", f"w{workers}", "--workers", workers, "--no-progress"],
            env={**os.environ, "FF_TEST_KEY": KEY}, capture_output=True, text=True, timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        meta = json.loads((out / "run.json").read_text())
        assert meta["status"] == "ok" and meta["timings"]["client_workers"] == int(workers)
        assert meta["timings"]["client_cpu_s"] >= meta["timings"]["client_cpu_peak_s"] > 0
        reqs = sorted(pq.read_table(out / "requests.parquet").to_pylist(), key=lambda r: r["request_id"])
        runs[workers] = reqs
        assert [r["request_id"] for r in reqs] == list(range(24))
        for r in reqs:
            assert r["status"] == "ok" and r["output_tokens_received"] == 16, r
            assert r["server_queue_ms"] is not None and r["server_prefill_ms"] is not None
            assert r["t_scheduled"] <= r["t_sent"] <= r["t_first_token"] <= r["t_done"]
        toks = pq.read_table(out / "tokens.parquet").to_pylist()
        assert sum(t["n"] for t in toks) == 24 * 16
    assert [r["t_scheduled"] for r in runs["1"]] == [r["t_scheduled"] for r in runs["2"]]
    db = tmp_path / "w.duckdb"
    ingest([tmp_path / "w1", tmp_path / "w2"], db)
    labels = {d["experiment"]: d["label"] for d in write_diagnosis(db, DiagnosisRules()).to_dicts()}
    assert labels["w1"] == labels["w2"], labels


def test_an_endpoint_told_its_cap_gets_the_pipelines_label(server, tmp_path):
    """The e2e study's seq_limit experiment (tests/configs/e2e.yaml: its heavy schedule in a
    closed loop of 16 on a cap of 8, which test_pipeline_e2e's own server start labels
    active-sequence limit) replayed against this server, started by the project with the
    same cap and told it: the same label. The same run not told its cap cannot have that
    label, and its diagnosis says so instead of guessing."""
    import shutil

    from filledfirst.analysis.diagnosis import write_diagnosis
    from filledfirst.analysis.diagnosis.labels import Label
    from filledfirst.config import load_config
    from filledfirst.study import DiagnosisRules
    from filledfirst.workloads.synthetic import write_synthetic_schedule

    from conftest import REPO

    cfg = load_config([REPO / "tests" / "configs" / "e2e.yaml"])
    experiment = cfg["experiments"]["seq_limit"]
    cap = experiment["server"]["max_num_seqs"]
    write_synthetic_schedule(cfg["workloads"][experiment["workload"]], tmp_path / "heavy.parquet")
    told = tmp_path / "told"
    proc = subprocess.run(
        [sys.executable, "-m", "filledfirst", "replay", "--url", server.base_url, "--schedule",
         str(tmp_path / "heavy.parquet"), "--out", str(told), "--model", "tiny", "--token-ids", "10", "2050",
         "--closed", str(experiment["loadgen"]["concurrency"]), "--max-num-seqs", str(cap),
         "--api-key-env", "FF_TEST_KEY", "--name", "told", "--no-progress"],
        env={**os.environ, "FF_TEST_KEY": KEY}, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((told / "run.json").read_text())
    assert meta["server"]["settings"] == {"max_num_seqs": cap}
    # the same measurement without the cap stated: what a replay without --max-num-seqs records
    untold = tmp_path / "untold"
    shutil.copytree(told, untold)
    meta.update(run_id=meta["run_id"] + "-untold", experiment="untold")
    meta["server"]["settings"] = {}
    (untold / "run.json").write_text(json.dumps(meta))
    db = tmp_path / "told.duckdb"
    ingest([told, untold], db)
    write_diagnosis(db, DiagnosisRules())
    con = duckdb.connect(str(db), read_only=True)
    found = {e: (label, notes) for e, label, notes in con.execute(
        "SELECT experiment, label, notes FROM diagnosis").fetchall()}
    con.close()
    assert found["told"][0] == Label.SEQ_LIMIT, found
    assert found["untold"][0] != Label.SEQ_LIMIT, found
    assert "max_num_seqs unknown (a server the study did not start: `replay --max-num-seqs`" in found["untold"][1]
    assert f"so no label {Label.SEQ_LIMIT}" in found["untold"][1]
