"""A typo in the config is an error naming the key path and the allowed values, before
any server starts."""

import copy
import subprocess
import sys

import pytest
import yaml

from filledfirst.config import load_config, validate_config
from filledfirst.errors import UserError

from conftest import REPO, snakemake_argv

E2E = REPO / "tests" / "configs" / "e2e.yaml"


@pytest.mark.parametrize("mutate, expected", [
    (lambda c: c["engine"].update(launcher="cuda"),
     "engine.launcher: 'cuda' is not one of the allowed values ['cpu', 'gpu', 'llamacpp', 'sglang']"),
    (lambda c: c["experiments"]["seq_limit"]["server"].update(max_num_seqs=0),
     "experiments.seq_limit.server.max_num_seqs: 0 is less than the minimum of 1"),
    (lambda c: c["experiments"]["seq_limit"].update(isolated=True),
     "experiments.seq_limit: Additional properties are not allowed ('isolated' was unexpected)"),
    (lambda c: c["experiments"]["seq_limit"]["server"].update(max_num_seq=8),
     "experiments.seq_limit.server: Additional properties are not allowed ('max_num_seq' was unexpected)"),
    (lambda c: c["experiments"]["seq_limit"].update(server={"url": "http://10.0.0.7:8000", "enforce_eager": True}),
     "experiments.seq_limit.server: Additional properties are not allowed ('enforce_eager' was unexpected)"),
    (lambda c: c["experiments"]["seq_limit"].update(server={"url": "http://me:secret@10.0.0.7:8000"}),
     "experiments.seq_limit.server.url: 'http://me:secret@10.0.0.7:8000' does not match"),
    (lambda c: c["experiments"]["reference"].update(section="kv"),
     "experiments.reference.section: 'kv' is not in sections (['azure', 'compute', 'concurrency_sweep', "
     "'decode_load', 'interference', 'kv_capacity', 'llamacpp_sweep', 'prefix_cache', 'sequence_limit', "
     "'token_budget'])"),
    (lambda c: c["experiments"].update({"seq limit;rm": c["experiments"]["seq_limit"]}),
     "experiments: 'seq limit;rm' does not match '^[A-Za-z_][A-Za-z0-9_]*$'"),
])
def test_schema_errors_name_the_key_path(mutate, expected):
    cfg = copy.deepcopy(load_config([E2E]))
    mutate(cfg)
    with pytest.raises(UserError) as err:
        validate_config(cfg)
    assert expected in str(err.value)


def test_snakemake_refuses_a_bad_config_before_any_job(tmp_path):
    cfg = yaml.safe_load(E2E.read_text())
    cfg["engine"]["launcher"] = "cuda"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(snakemake_argv(tmp_path, bad, "all"), capture_output=True, text=True, timeout=120,
                          env={"PATH": f"{sys.exec_prefix}/bin:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    allowed = "['cpu', 'gpu', 'llamacpp', 'sglang']"
    assert f"engine.launcher: 'cuda' is not one of the allowed values {allowed}" in out, out[-2000:]
    assert not (tmp_path / "results").exists()  # nothing ran
