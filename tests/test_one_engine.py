"""One vLLM server at a time on one machine, however many cores Snakemake is given: two
server groups whose schedules are ready together still run one after the other."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys

import pytest
import yaml

from conftest import REPO, engine_overlay_files, with_engine_overlay

pytestmark = pytest.mark.engine


def _interval(run_json) -> tuple[dt.datetime, dt.datetime]:
    meta = json.loads(run_json.read_text())
    assert meta["status"] == "ok", meta["error"]
    return dt.datetime.fromisoformat(meta["started_at"]), dt.datetime.fromisoformat(meta["finished_at"])


def test_two_server_groups_never_run_at_once_with_four_cores(tmp_path, pipeline_env):
    cfg = yaml.safe_load((REPO / "tests" / "configs" / "e2e.yaml").read_text())
    cfg["workloads"] = {"few": {"kind": "synthetic", "phases": [
        {"role": "decode", "count": 4, "interval_s": 0.25, "prompt_tokens": 50, "output_tokens": 8}]}}
    # Different server settings: two groups, two server starts, two jobs ready at once.
    cfg["experiments"] = {"seqs8": {"workload": "few", "server": {"max_num_seqs": 8}},
                          "seqs16": {"workload": "few", "server": {"max_num_seqs": 16}}}
    cfg.pop("frontiers", None)
    config = tmp_path / "two.yaml"
    config.write_text(yaml.safe_dump(with_engine_overlay(cfg)))
    argv = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path),
            "--cores", "4", "results/runs/seqs8", "results/runs/seqs16",
            "--configfile", str(config), *map(str, engine_overlay_files())]
    proc = subprocess.run(argv, env=pipeline_env, capture_output=True, text=True, timeout=900,
                          start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = sorted(_interval(tmp_path / "results" / "runs" / e / "run.json") for e in ("seqs8", "seqs16"))
    assert first[1] <= second[0], f"two servers at once: {first} and {second}"
