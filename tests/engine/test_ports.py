"""Port collisions: a port the study picked is picked again when another process took it
first (on the real engine); a fixed port that is taken fails the run clearly, with
nothing started."""

import json
import socket
import subprocess
import sys

import pytest
import yaml

from filledfirst.config import experiment_spec, load_config
from filledfirst.engine import shared as shared_module
from filledfirst.engine.server import free_port
from filledfirst.engine.shared import SharedServer
from filledfirst.model.tiny import build_tiny_model
from filledfirst.study import as_study
from filledfirst.workloads.synthetic import write_synthetic_schedule

from conftest import REPO


@pytest.fixture
def taken_port():
    """A port another process listens on (bound and listening: vLLM's SO_REUSEADDR
    does not get past that)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.fixture
def config(tmp_path):
    cfg = yaml.safe_load((REPO / "tests" / "configs" / "long.yaml").read_text())
    cfg["model"]["path"] = str(tmp_path / "model")
    cfg["workloads"]["few"] = {"kind": "synthetic", "phases": [
        {"role": "decode", "count": 3, "interval_s": 0.2, "prompt_tokens": 50, "output_tokens": 8}]}
    cfg["experiments"] = {"few": {"workload": "few"}}
    build_tiny_model(tmp_path / "model")
    return cfg


@pytest.mark.engine
def test_a_picked_port_that_was_taken_is_picked_again(config, tmp_path, taken_port, monkeypatch):
    picks = iter([taken_port])  # the first pick collides, as with another pipeline
    picked = []

    def pick(host):
        picked.append(next(picks, None) or free_port(host))
        return picked[-1]

    monkeypatch.setattr(shared_module, "free_port", pick)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    server = SharedServer(experiment_spec(as_study(load_config([path])), "few").server_spec, tmp_path / "server.log")
    try:
        assert server.ready("few") is None  # started
        assert server.alive() and not server.base_url.endswith(f":{taken_port}")
    finally:
        server.stop()
    assert picked[0] == taken_port and len(picked) == 2  # the first pick was refused, the second served


def test_a_fixed_port_that_is_taken_fails_the_run_with_the_reason(config, tmp_path, taken_port):
    config["engine"]["port"] = taken_port
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    write_synthetic_schedule(config["workloads"]["few"], tmp_path / "s.parquet")
    out = tmp_path / "runs" / "few"
    proc = subprocess.run(
        [sys.executable, "-m", "filledfirst", "run", "--config", str(path), "--experiment", "few",
         "--schedule", str(tmp_path / "s.parquet"), "--out", str(out), "--no-progress"],
        cwd=tmp_path, capture_output=True, text=True, timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]  # the folder was written: a result, not a crash
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "failed"
    assert f"port {taken_port} on 127.0.0.1 is already in use by another program" in meta["error"].split("\n")[0]
    assert f"--port {taken_port}" in " ".join(meta["server"]["argv"])
    assert not (out / "server.log").read_text()  # vLLM was never started
