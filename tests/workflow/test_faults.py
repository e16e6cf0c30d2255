"""Faults injected on the real vLLM CPU engine: a server that cannot start costs only its
own experiment, and the report says why; with several cores, still one server at a time."""

import datetime as dt
import json
import subprocess

import duckdb
import pytest
import yaml

from conftest import REPO, snakemake_argv

pytestmark = pytest.mark.engine

SECRETS = ("planted-flag-secret-81f3", "planted-env-secret-5d0c")


def fault_config(tmp_path):
    cfg = yaml.safe_load((REPO / "tests" / "configs" / "e2e.yaml").read_text())
    # 16 short requests over 4.5 s: never a queue against a cap of 64 at any CPU speed,
    # and enough scrapes in the loaded window for a label.
    light = {"kind": "synthetic", "phases": [
        {"role": "decode", "count": 16, "interval_s": 0.3, "prompt_tokens": 50, "output_tokens": 16}]}
    cfg["workloads"] = {"light": light}
    cfg["experiments"] = {
        "good": {"workload": "light"},
        # vLLM's argument parser refuses it at once, and echoes every argument it did not
        # know, the planted secret among them.
        "bad_argument": {"workload": "light", "server": {"extra_args": ["--no-such-flag", "--my-token", SECRETS[0]]}},
        # 10 blocks of 128 tokens cannot hold one max_model_len (16,384) sequence.
        "kv_too_small": {"workload": "light", "server": {"num_gpu_blocks_override": 10}},
    }
    cfg["engine"]["env"] = {"HF_TOKEN": SECRETS[1]}  # every server gets it; nothing may store it
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_servers_that_cannot_start_cost_only_their_experiment(tmp_path, pipeline_env):
    cfg = fault_config(tmp_path)
    # Four cores: the three server groups are ready together, and still run one at a time.
    argv = snakemake_argv(tmp_path, cfg, "all", "--keep-going")
    argv[argv.index("--cores") + 1] = "4"
    proc = subprocess.run(argv, env=pipeline_env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-6000:]
    runs = tmp_path / "results" / "runs"
    meta = {exp: json.loads((runs / exp / "run.json").read_text()) for exp in ("good", "bad_argument", "kv_too_small")}
    spans = sorted((dt.datetime.fromisoformat(m["started_at"]), dt.datetime.fromisoformat(m["finished_at"]))
                   for m in meta.values())
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), f"two servers at once: {spans}"
    assert meta["good"]["status"] == "ok"
    for exp in ("bad_argument", "kv_too_small"):
        assert meta[exp]["status"] == "failed"
        assert "before it was healthy" in meta[exp]["error"]  # and the log tail follows
        assert (runs / exp / "server.log").stat().st_size > 0
    assert "no-such-flag" in meta["bad_argument"]["error"]
    # vLLM says the KV cache cannot hold a max_model_len sequence
    assert "max_model_len" in meta["kv_too_small"]["error"] or "KV cache" in meta["kv_too_small"]["error"]

    con = duckdb.connect(str(tmp_path / "results" / "filledfirst.duckdb"), read_only=True)
    labels = dict(con.execute("SELECT experiment, label FROM diagnosis").fetchall())
    assert labels == {"good": "reference", "bad_argument": "failed", "kv_too_small": "failed"}
    html = (tmp_path / "reports" / "report.html").read_text()
    assert "bad_argument" in html and "kv_too_small" in html and "no-such-flag" in html

    # Secrets the servers were started with reach no file the study wrote, though vLLM's
    # own error quoted one of them.
    assert "unrecognized arguments" in meta["bad_argument"]["error"]
    for path in [*(tmp_path / "results").rglob("*"), tmp_path / "reports" / "report.html"]:
        if path.is_file():
            data = path.read_bytes()
            assert not any(secret.encode() in data for secret in SECRETS), f"a planted secret in {path}"

    # The failed runs are results: a second call has nothing to do.
    again = subprocess.run(snakemake_argv(tmp_path, cfg, "all", "-n"), env=pipeline_env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
