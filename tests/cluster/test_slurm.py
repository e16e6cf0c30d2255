"""The study on SLURM with the profile profiles/slurm (snakemake-executor-plugin-slurm).

1. What the GPU study (config/config.yaml) would submit: the real plugin against stand-in
   SLURM commands that record every sbatch call (no cluster, no GPU needed).
2. A small CPU study through a real one-node SLURM cluster started on this machine
   (tests/helpers/slurm_cluster.py): experiment jobs through sbatch, the rest local, the report built.
"""

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import psutil
import pytest

from filledfirst.cluster import runtime_minutes
from filledfirst.config import load_config, load_study, server_groups
from filledfirst.study import as_study

from conftest import REPO
from helpers.slurm_cluster import SlurmCluster, missing_requirements

PROFILE = REPO / "profiles" / "slurm"


def profile_argv(configfile: Path, *extra: str) -> list[str]:
    """Snakemake with the SLURM profile, started in the work folder (the plugin puts its
    logs relative to where Snakemake starts)."""
    return [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "workflow" / "Snakefile"),
            "--profile", str(PROFILE), *extra, "all", "--configfile", str(configfile)]


def sbatch_options(call: list[str]) -> dict[str, str]:
    """`--name value`, `--name=value` and `-x value` of one sbatch call, by name."""
    opts, i = {}, 0
    while i < len(call):
        arg = call[i]
        if arg.startswith("--") and "=" in arg:
            key, _, value = arg.partition("=")
            opts[key] = value
        elif arg.startswith("-") and i + 1 < len(call) and not call[i + 1].startswith("-"):
            opts[arg] = call[i + 1]
            i += 1
        else:
            opts[arg] = ""
        i += 1
    return opts


# --- 1. what the GPU study would submit ---------------------------------------------

FAKE = {
    # records its arguments, answers like `sbatch --parsable`
    "sbatch": """
        import json, os, sys
        limit = os.environ.get("FAKE_SLURM_MAX_MIN")  # the partition's MaxTime, as sbatch enforces it
        if limit and int(sys.argv[sys.argv.index("-t") + 1]) > int(limit):
            sys.exit("sbatch: error: Batch job submission failed: Requested time limit is invalid")
        log = os.environ["FAKE_SLURM_LOG"]
        n = sum(1 for _ in open(log)) if os.path.exists(log) else 0
        with open(log, "a") as f:
            f.write(json.dumps(sys.argv[1:]) + "\\n")
        print(1000 + n)
    """,
    # every submitted job: "failed" at once, so Snakemake stops after submitting
    "squeue": """
        import json, os
        log = os.environ["FAKE_SLURM_LOG"]
        n = sum(1 for _ in open(log)) if os.path.exists(log) else 0
        for i in range(n):
            print(f"{1000 + i}|FAILED")
    """,
    "sinfo": 'print("PARTITION\\ngpu*")',
    "scontrol": 'print("MaxArraySize            = 1001\\nMinJobAge               = 3600 sec")',
    "sacct": 'import sys; sys.exit("sacct: stand-in has no accounting")',
    "scancel": "",
    "sacctmgr": 'print("proj-7")',
}


@pytest.fixture
def fake_slurm(tmp_path):
    bin_dir = tmp_path / "fake-slurm"
    bin_dir.mkdir()
    for name, body in FAKE.items():
        path = bin_dir / name
        path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
        path.chmod(0o755)
    return bin_dir


def submit_to_fake_slurm(cfg_path: Path, tmp_path: Path, pipeline_env: dict, fake_slurm: Path,
                         max_min: int | None = None) -> tuple[list, str]:
    """Run the study with the SLURM profile against the stand-in commands: every sbatch
    call (options by name) and Snakemake's output. The stand-in fails every job, so
    Snakemake submits the jobs that need nothing from another job, then stops."""
    work = tmp_path / "work"
    work.mkdir()
    # a hub model is fetched where Snakemake runs before anything is submitted (the rule
    # fetch_model, tested in tests/model/test_fetch.py): here, fetched before
    model = load_study([cfg_path]).model
    if model.source == "hub":
        folder = work / model.folder
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
    log = tmp_path / "sbatch.jsonl"
    env = {**pipeline_env, "FAKE_SLURM_LOG": str(log),
           "PATH": f"{fake_slurm}{os.pathsep}{pipeline_env['PATH']}",
           **({"FAKE_SLURM_MAX_MIN": str(max_min)} if max_min else {})}
    env.pop("SLURM_CONF", None)
    proc = subprocess.run(
        profile_argv(cfg_path, "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "1",
                     "--seconds-between-status-checks", "1", "--latency-wait", "1"),
        cwd=work, env=env, capture_output=True, text=True, timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert log.is_file(), out[-6000:]
    # The stand-in "failed" every job, which Snakemake reported and stopped on.
    assert proc.returncode != 0 and "FAILED" in out
    return [sbatch_options(json.loads(line)) for line in log.read_text().splitlines()], out


def assert_gpu_job(opts: dict, work: Path, rule: str) -> None:
    assert opts["--gpus"] == "1" and opts["--ntasks-per-gpu"] == "1"
    assert opts["--cpus-per-task"] == "8" and opts["--mem"] == "65536"
    assert opts["-p"] == "gpu"  # the cluster's default partition (sinfo's `*`)
    assert opts["--output"] == str(work / "results" / "logs" / "slurm" / f"rule_{rule}" / "%j.log")
    assert opts["-D"] == str(work)
    assert "--executor slurm-jobstep" in opts["--wrap"] and rule in opts["--wrap"]


def test_gpu_study_submits_one_job_per_capacity_search_first(tmp_path, pipeline_env, fake_slurm):
    """The GPU study places its experiments relative to knees: its first jobs are the
    searches, one per (frontier, setting) or per group probing the same server, each
    asking for a GPU like an experiment job, beside the groups of the experiments that
    need no knee (the closed loops of the token-budget, head-of-line KV and compute pairs)."""
    from filledfirst.cluster import hosted_seconds
    from filledfirst.config import checks_of, hosted_experiments, search_groups
    from filledfirst.frontier.plan import frontier_runtime_minutes, paired_check_minutes
    from filledfirst.study import Study

    cfg_path = REPO / "config" / "config.yaml"
    calls, out = submit_to_fake_slurm(cfg_path, tmp_path, pipeline_env, fake_slurm)
    cfg = load_config([cfg_path])
    configured = {f"{f}/{s}" for f, spec in cfg["frontiers"].items() for s in spec["settings"]}
    groups = {lead: members for lead, members in search_groups(as_study(cfg)).items() if lead in configured}
    assert ["decode/default", "prefix/cache_off", "azure/default"] in groups.values()
    searches = {f"frontier_{lead.replace('/', '_')}": members for lead, members in groups.items()}
    by_rule = {opts["--comment"].removeprefix("rule_"): opts for opts in calls}
    def on_a_knee(e):
        workload = cfg["workloads"][cfg["experiments"][e]["workload"]]
        return any(isinstance(p.get("rate"), dict) for p in workload.get("phases", [workload]))

    free = {f"run_group_{group}" for group, names in server_groups(as_study(cfg)).items()
            if not any(on_a_knee(e) for e in names)}
    assert free == {"run_group_budget_large", "run_group_budget_small", "run_group_kv_head",
                    "run_group_compute_prefill"}
    assert len(calls) == len(searches) + len(free) and set(by_rule) == set(searches) | free, out[-6000:]
    study = Study.from_dict(cfg)
    hosted, checks = hosted_experiments(as_study(cfg)), checks_of(as_study(cfg))
    assert hosted, "the GPU study's searches host the experiments placed on their knees"
    assert checks, "the GPU study's interventions are judged side by side in their parents' jobs"
    for rule, members in searches.items():
        assert_gpu_job(by_rule[rule], tmp_path / "work", rule)
        # each search, then each hosted experiment's bound at the lowest knee it can meet
        bounds = [hosted_seconds(study, e, tmp_path / "work" / "data" / "traces" / f"{trace}.csv"
                                 if (trace := getattr(study.workloads[study.experiments[e].workload], "trace", None))
                                 else None)
                  for key in members for e in hosted.get(key, [])]
        expected = sum(frontier_runtime_minutes(study, key.split("/")[0]) for key in members)
        # and the paired checks of their interventions judged side by side alone
        expected += sum(paired_check_minutes(study, *check.split("/"))
                        for key in members for check in checks.get(key, []))
        assert by_rule[rule]["-t"] == str(expected + math.ceil(sum(bounds) / 60))


def without_searches(tmp_path: Path) -> Path:
    """The GPU study at the original study's absolute rates with no search at all (the
    interference probes every 50 ms): its first jobs are the experiment groups."""
    import yaml

    cfg = load_config([REPO / "config" / "config.yaml", REPO / "config" / "original-rates.yaml"])
    cfg.pop("frontiers")
    for phase in cfg["workloads"]["interference"]["phases"] + cfg["workloads"]["interference_control"]["phases"]:
        if phase.pop("rate", None) is not None:
            phase["interval_s"] = 0.05
    # The original study ran without prefix caching: its rates leave that section relative.
    cfg["experiments"] = {name: e for name, e in cfg["experiments"].items() if e.get("section") != "prefix_cache"}
    used = {e["workload"] for e in cfg["experiments"].values()}
    cfg["workloads"] = {name: wl for name, wl in cfg["workloads"].items() if name in used}
    path = tmp_path / "gpu-absolute.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def test_gpu_study_asks_slurm_for_a_gpu_per_server_group(tmp_path, pipeline_env, fake_slurm):
    """On a site whose sbatch wants --gres, a partition and an account, and refuses a time
    limit beyond the partition's (the searches' jobs ask for --gpus, and the cluster's
    default partition: test_gpu_study_submits_one_job_per_capacity_search_first)."""
    import yaml

    cfg_path = without_searches(tmp_path)
    site = yaml.safe_load(cfg_path.read_text())
    most = 3000  # the partition's MaxTime in minutes, above what every job of this study needs
    site["cluster"] = {**site.get("cluster", {}), "gpu_request": "gres", "partition": "gpu-long",
                       "account": "proj-7", "max_runtime_min": most}
    cfg_path.write_text(yaml.safe_dump(site, sort_keys=False))
    calls, out = submit_to_fake_slurm(cfg_path, tmp_path, pipeline_env, fake_slurm, max_min=most)
    work = tmp_path / "work"
    cfg = load_config([cfg_path])
    groups = server_groups(as_study(cfg))
    by_group = {opts["--comment"].removeprefix("rule_run_group_"): opts for opts in calls}
    # One sbatch per server group and nothing else: schedules, ingest and report are local.
    assert len(calls) == len(groups) and set(by_group) == set(groups), out[-6000:]
    assert "Requested time limit is invalid" not in out
    for group, members in groups.items():
        opts = by_group[group]
        schedules = [work / "data" / "schedules" / f"{cfg['experiments'][e]['workload']}.parquet" for e in members]
        assert opts["--gres"] == "gpu:1" and "--gpus" not in opts  # SLURM refuses both
        assert opts["-p"] == "gpu-long" and opts["-A"] == "proj-7"
        assert opts["--cpus-per-task"] == "8" and opts["--mem"] == "65536"
        assert opts["-t"] == str(runtime_minutes(as_study(cfg), members, schedules))
        assert int(opts["-t"]) <= most
    # The time limit follows the schedule: start-up 900 s, then natural12's last arrival
    # (600 requests every 0.5 s: 299.5 s) and the 600 s drain -> 30 min.
    assert by_group["seq_limit"]["-t"] == "30"
    # The 16-experiment group: 900 s + sum of last arrivals + 16 x 600 s drain.
    assert int(by_group["interference"]["-t"]) > int(by_group["kv_reduced"]["-t"]) > 30


# --- 2. a real SLURM cluster on this machine ------------------------------------------

@pytest.fixture
def slurm(tmp_path):
    problem = missing_requirements()
    if problem:
        if os.environ.get("CI"):  # CI runs as root and `make test` installs SLURM: a real failure
            pytest.fail(problem)
        pytest.skip(problem)
    with SlurmCluster(tmp_path / "slurm") as cluster:
        yield cluster


def logs_of(work: Path) -> str:
    """The tails of every log the study wrote (Snakemake's, sbatch's, the runs')."""
    return "\n".join(f"--- {f}:\n" + "\n".join(f.read_text(errors="replace").splitlines()[-40:])
                     for f in sorted((work / "results" / "logs").rglob("*.log")))


@pytest.mark.engine
def test_study_on_a_real_slurm_cluster(tmp_path, slurm):
    cfg_path = REPO / "tests" / "configs" / "slurm.yaml"
    work = tmp_path / "work"
    work.mkdir()
    env = slurm.env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["HF_HUB_OFFLINE"] = "1"
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            # No slurmdbd, so no sacct: job states from squeue (the cluster keeps finished
            # jobs listed for an hour).
            profile_argv(cfg_path, "--slurm-status-command", "squeue",
                         "--slurm-init-seconds-before-status-checks", "10"),
            cwd=work, env=env, capture_output=True, text=True, timeout=1500,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"Snakemake did not finish: {exc.stderr[-6000:] if exc.stderr else ''}\n"
                    f"{logs_of(work)}\n{slurm.diagnostics()}")
    elapsed = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{out[-6000:]}\n{logs_of(work)}\n{slurm.diagnostics()}"

    cfg = load_config([cfg_path])
    (group, members), = server_groups(as_study(cfg)).items()

    # Exactly the experiment job went through sbatch (one per server group) and finished.
    jobs = slurm.jobs()
    assert [j["comment"] for j in jobs] == [f"rule_run_group_{group}"], jobs
    job = jobs[0]
    record, = slurm.completed_jobs()
    assert record["JobId"] == job["id"] and job["state"] == record["JobState"] == "COMPLETED"
    assert record["ExitCode"] == "0:0" and record["WorkDir"] == str(work)
    assert f"has been submitted with SLURM jobid {job['id']}" in out
    # What it asked for: the config's CPUs and memory, no GPU, and the time worked out
    # from its runs' deadlines: 900 s start-up, the open loop's 5.5 s of arrivals and 120 s
    # drain, the closed loop's 12 requests over 4 workers at 120 s each (360 s): 24 min.
    assert job["cpus"] == "2" and job["memory"] == "4G" and job["tres_per_node"] == "N/A"
    assert "gpu" not in record["Tres"]
    schedules = [work / "data" / "schedules" / f"{cfg['experiments'][e]['workload']}.parquet" for e in members]
    assert record["TimeLimit"] == str(runtime_minutes(as_study(cfg), members, schedules)) == "24"
    # sbatch's log of the job, kept by the profile beside the run's own logs
    slurm_log = work / "results" / "logs" / "slurm" / f"rule_run_group_{group}" / f"{job['id']}.log"
    assert f"rule run_group_{group}:" in slurm_log.read_text()
    # Each experiment ran inside the job, on the node, against the one vLLM it started.
    for exp in members:
        meta = json.loads((work / "results" / "runs" / exp / "run.json").read_text())
        assert meta["status"] == "ok", meta["error"]
        assert meta["hardware"]["batch_job"]["slurm_job_id"] == job["id"]
        assert meta["hardware"]["batch_job"]["node"] == record["NodeList"]
        assert meta["server"]["started_by"] == members[0]

    # Local: the model, the schedules, the one DuckDB writer (ingest) and the report.
    for rule in ("tiny_model", "schedule_synthetic", "ingest", "report"):
        assert f"localrule {rule}:" in out
    con = duckdb.connect(str(work / "results" / "filledfirst.duckdb"), read_only=True)
    runs = dict(con.execute("SELECT experiment, status FROM runs").fetchall())
    assert runs == {"open_loop": "ok", "closed_loop": "ok"}
    assert con.execute("SELECT count(*) FROM requests WHERE status = 'ok'").fetchone()[0] == 24
    con.close()
    html = (work / "reports" / "report.html").read_text()
    assert "open_loop" in html and "closed_loop" in html

    # Torn down: no daemon, job step or vLLM of this cluster left.
    killed = slurm.stop()
    assert killed == [], killed
    assert all(p.poll() is not None for p in slurm.procs.values())
    servers = [p for p in psutil.process_iter(["cmdline", "cwd"])
               if "vllm.entrypoints.openai.api_server" in (p.info["cmdline"] or []) and p.info["cwd"] == str(work)]
    assert servers == []
    print(f"SLURM study: {elapsed:.0f} s")
