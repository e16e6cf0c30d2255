"""What an experiment job asks a cluster for (filledfirst.cluster): GPUs, CPUs, memory, time."""

import copy
from pathlib import Path

import polars as pl
import pytest
import yaml

from filledfirst import cluster
from filledfirst.cluster import gpus_per_job, job_request, last_arrival_s, runtime_minutes
from filledfirst.config import SCHEMA_PATH, experiment_spec, load_config, validate_config
from filledfirst.schedule import write_schedule
from filledfirst.study import as_study

from conftest import REPO


def schedule(path: Path, offsets: list[float]) -> Path:
    df = pl.DataFrame({"t_offset_s": offsets, "prompt_tokens": [10] * len(offsets),
                       "output_tokens": [5] * len(offsets), "role": ["r"] * len(offsets)})
    write_schedule(df, path, {})
    return path


@pytest.fixture
def cfg() -> dict:
    base = load_config([REPO / "tests" / "configs" / "e2e.yaml"])
    base["experiments"] = {
        "a": {"workload": "light"},
        "b": {"workload": "heavy"},
        "c": {"workload": "light", "loadgen": {"mode": "closed", "concurrency": 2}},
    }
    validate_config(base)
    return base


def test_gpu_default_follows_the_launcher(cfg):
    assert gpus_per_job(as_study(cfg)) == 0  # the cpu launcher
    gpu = copy.deepcopy(cfg)
    gpu["engine"]["launcher"] = "gpu"
    gpu["engine"]["server"].pop("kv_cache_space_gib")
    assert gpus_per_job(as_study(gpu)) == 1
    # a server sharded over two GPUs: every job asks for the most any server takes
    first = next(iter(gpu["experiments"]))
    gpu["experiments"][first].setdefault("server", {})["tensor_parallel_size"] = 2
    assert gpus_per_job(as_study(gpu)) == 2
    gpu["cluster"]["gpus_per_job"] = 0  # a GPU-less cluster
    assert job_request(as_study(gpu))["gpu"] == 0


def test_gpu_study_asks_for_one_gpu_and_its_model():
    cfg = load_config([REPO / "config" / "config.yaml"])
    assert job_request(as_study(cfg)) == {"engine": 1, "gpu": 1, "cpus_per_task": 8, "mem_mb": 65536}
    cfg["cluster"]["gpu_model"] = "a100"
    assert job_request(as_study(cfg))["gpu_model"] == "a100"
    cfg["cluster"]["gpus_per_job"] = 0
    assert "gpu_model" not in job_request(as_study(cfg))  # no model without a GPU


def test_schema_and_code_defaults_agree(cfg):
    props = yaml.safe_load(SCHEMA_PATH.read_text())["properties"]["cluster"]["properties"]
    assert props["cpus_per_job"]["default"] == cluster.DEFAULT_CPUS
    assert props["mem_mb"]["default"] == cluster.DEFAULT_MEM_MB
    assert cfg["cluster"] == {"cpus_per_job": cluster.DEFAULT_CPUS, "mem_mb": cluster.DEFAULT_MEM_MB,
                              "gpu_request": "gpus"}


def test_a_site_that_wants_gres_a_partition_and_an_account_gets_them():
    cfg = load_config([REPO / "config" / "config.yaml"])
    cfg["cluster"].update(gpu_request="gres", gpu_model="a100", partition="gpu", account="proj-7")
    asked = job_request(as_study(cfg))
    assert asked == {"engine": 1, "gres": "gpu:a100:1", "cpus_per_task": 8, "mem_mb": 65536,
                     "slurm_partition": "gpu", "slurm_account": "proj-7"}  # no gpu beside gres: SLURM refuses both


def test_a_job_longer_than_the_partition_takes_is_refused_with_its_arithmetic():
    from filledfirst.cluster import job_resources
    from filledfirst.errors import UserError
    from filledfirst.frontier.plan import frontier_runtime_minutes, paired_check_minutes
    from filledfirst.plan import build_plan

    cfg = load_config([REPO / "config" / "config.yaml"])
    study = as_study(cfg)
    # a search and its interventions' paired checks
    job = next(j for j in build_plan(study).jobs if j.searches and j.checks and not j.experiments)
    minutes = sum(frontier_runtime_minutes(study, s.frontier) for s in job.searches)
    minutes += sum(paired_check_minutes(study, c.frontier, c.setting) for c in job.checks)
    assert job_resources(study, job)["runtime"] == minutes  # no limit known: asked as it is
    cfg["cluster"]["max_runtime_min"] = minutes
    assert job_resources(as_study(cfg), job)["runtime"] == minutes  # exactly the limit fits
    cfg["cluster"]["max_runtime_min"] = minutes - 1
    with pytest.raises(UserError) as refused:
        job_resources(as_study(cfg), job)
    said = str(refused.value)
    assert said.startswith(f"job {job.name} needs a time limit of {minutes} min (search ")
    assert f"and the partition takes at most {minutes - 1} (cluster.max_runtime_min)" in said


def test_bad_cluster_settings_are_refused(cfg):
    from filledfirst.errors import UserError

    for bad in ({"gpus_per_job": -1}, {"gpu_model": "a100; rm -rf /"}, {"cpus": 2}):
        broken = copy.deepcopy(cfg)
        broken["cluster"] = bad
        with pytest.raises(UserError):
            validate_config(broken)


def test_last_arrival(tmp_path):
    assert last_arrival_s(schedule(tmp_path / "s.parquet", [0.0, 2.5, 1.0])) == 2.5
    assert last_arrival_s(schedule(tmp_path / "e.parquet", [])) == 0.0
    missing = str(tmp_path / "missing.parquet")
    with pytest.raises(FileNotFoundError) as err:
        last_arrival_s(missing)
    # Snakemake shows a resource as "not known yet" when the error names its input file
    assert err.value.filename == missing


def test_runtime_is_startup_plus_each_experiments_span_and_drain(cfg, tmp_path):
    s1 = schedule(tmp_path / "1.parquet", [0.0, 100.0, 200.0])
    s2 = schedule(tmp_path / "2.parquet", [0.0, 50.0])
    s3 = schedule(tmp_path / "3.parquet", [0.0, 999.0])  # closed loop: offsets ignored
    # start-up 400 s (engine.startup_timeout_s), drain 120 s (loadgen.drain_timeout_s)
    assert runtime_minutes(as_study(cfg), ["a"], [s1]) == 12  # 400 + 200 + 120 = 720 s
    assert runtime_minutes(as_study(cfg), ["a", "b"], [s1, s2]) == 15  # 720 + 50 + 120 = 890 s -> 14.8
    # closed loop, 2 requests on 2 workers: one request each, 120 s (loadgen.request_timeout_s)
    assert runtime_minutes(as_study(cfg), ["c"], [s3]) == 9  # 400 + 120 = 520 s -> 8.7
    cfg["cluster"].update(startup_allowance_s=60, drain_allowance_s=0)
    assert runtime_minutes(as_study(cfg), ["a", "b"], [s1, s2]) == 6  # 60 + 200 + 50 = 310 s
    cfg["cluster"].update(startup_allowance_s=0)
    assert runtime_minutes(as_study(cfg), ["c"], [s3]) == 1  # never 0
    with pytest.raises(ValueError):
        runtime_minutes(as_study(cfg), ["a", "b"], [s1])


def test_each_experiments_time_is_its_runs_deadline(cfg, tmp_path):
    """One definition (filledfirst.deadline): what the replay keeps is what the
    job is given. A closed loop is as long as its workers' turns of the request timeout,
    not one drain: against a hung server it took that, past the job's limit."""
    from filledfirst.deadline import run_deadline_s
    from filledfirst.loadgen.replay import Replay
    from filledfirst.loadgen.settings import ReplaySettings
    from filledfirst.schedule import load_schedule
    from filledfirst.study import Study

    study = Study.from_dict(cfg)
    s7 = schedule(tmp_path / "7.parquet", [0.0] * 7)
    s1 = schedule(tmp_path / "1.parquet", [0.0, 100.0, 200.0])
    for name, s in (("c", s7), ("a", s1)):
        spec = ReplaySettings.from_spec(experiment_spec(as_study(cfg), name))
        replay = Replay(load_schedule(s), "http://127.0.0.1:1", spec, progress=False)
        assert cluster.experiment_seconds(study, name, s) == replay.deadline_s
    assert cluster.experiment_seconds(study, "c", s7) == run_deadline_s("closed", 7, 2, 0, 120, 120) == 480
    assert runtime_minutes(as_study(cfg), ["c"], [s7]) == 15  # 400 s start-up + 4 x 120 s = 880 s -> 14.7


def test_run_json_records_the_slurm_job_and_its_gpus(monkeypatch):
    from filledfirst.run.provenance import hardware

    for var in ("SLURM_JOB_ID", "SLURMD_NODENAME", "SLURM_CPUS_PER_TASK", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    assert "batch_job" not in hardware()  # a local run records nothing of the kind
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu07")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "8")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert hardware()["batch_job"] == {"slurm_job_id": "42", "node": "gpu07", "cpus": "8", "cuda_visible_devices": "3"}


def test_a_job_against_an_external_endpoint_asks_for_no_gpu_and_no_startup(cfg, tmp_path):
    cfg["engine"]["launcher"] = "gpu"
    cfg["engine"]["server"].pop("kv_cache_space_gib")
    cfg["experiments"]["d"] = {"workload": "light", "server": {"url": "http://10.0.0.7:8000"}}
    validate_config(cfg)
    assert job_request(as_study(cfg), ["a"])["gpu"] == 1
    assert job_request(as_study(cfg), ["d"])["gpu"] == 0
    # no server started
    assert job_request(as_study(cfg), ["a"])["engine"] == 1 and job_request(as_study(cfg), ["d"])["engine"] == 0
    s = schedule(tmp_path / "s.parquet", [0.0, 100.0])
    assert runtime_minutes(as_study(cfg), ["d"], [s]) == 4  # 100 + 120 s drain, no start-up
