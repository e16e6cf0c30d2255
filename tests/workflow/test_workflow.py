"""The Snakemake workflow itself: lint-clean, and both studies plan the right jobs."""

import re
import subprocess
import sys

import pytest

from filledfirst.config import load_config, server_groups
from filledfirst.study import as_study

from conftest import REPO

SNAKEFILE = REPO / "workflow" / "Snakefile"


def snakemake(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("configfile", ["config/cpu.yaml", "config/config.yaml"])
def test_lint_is_clean(configfile):
    proc = subprocess.run([sys.executable, "tools/workflow_lint.py", "--configfile", configfile], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_lint_lets_only_the_missing_rule_environment_pass():
    sys.path.insert(0, str(REPO / "tools"))
    from workflow_lint import BY_DESIGN, lints

    out = ("Lints for rule a (line 1, x.smk):\n    * Specify a conda environment or container for each rule.:\n"
           "      body\n\nLints for rule b (line 9, x.smk):\n    * No log directive defined:\n      body\n")
    assert lints(out) == [("rule a (line 1, x.smk)", BY_DESIGN), ("rule b (line 9, x.smk)", "No log directive defined")]


def test_snakefmt_is_clean():
    proc = subprocess.run([sys.executable, "-m", "snakefmt", "--check", "workflow"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def job_stats(out: str) -> dict[str, int]:
    """The `Job stats` table of a dry run: rule -> number of jobs."""
    return {line.split()[0]: int(line.split()[1]) for line in out.splitlines()
            if len(line.split()) == 2 and line.split()[1].isdigit()}


@pytest.mark.parametrize("configfile, model_jobs", [("config/config.yaml", 0), ("config/cpu.yaml", 1)])
def test_dry_run_plans_one_job_per_server_group(tmp_path, configfile, model_jobs):
    proc = snakemake("--snakefile", str(SNAKEFILE), "--directory", str(tmp_path), "-n", "-p", "all",
                     "--configfile", str(REPO / configfile))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    stats = job_stats(out)
    groups = server_groups(as_study(load_config([REPO / configfile])))
    assert {rule: n for rule, n in stats.items() if rule.startswith("run_group_")} == {
        f"run_group_{group}": 1 for group in groups
    }
    assert stats["ingest"] == 1 and stats["diagnose"] == 1 and stats["report"] == 1
    assert stats.get("tiny_model", 0) == model_jobs
    # One `filledfirst job` per group, named after it; its experiments' folders, in config
    # order, are the job's outputs.
    blocks = by_rule(planned_jobs(out))
    for group, members in groups.items():
        _, _, outputs, shell = blocks[f"run_group_{group}"]
        assert f" -m filledfirst job --config {REPO / configfile} run_group_{group} --no-progress" in shell
        assert f"tee results/logs/run-{group}.log" in shell
        assert outputs == [f"results/runs/{e}" for e in members]
    # The three searches of the default server: one job, one start, each to its own folder,
    # then the experiments placed on that server.
    assert "frontier_prefix_cache_off" not in stats and "frontier_azure_default" not in stats
    _, inputs, outputs, shell = blocks["frontier_decode_default"]
    assert outputs[:3] == ["results/frontiers/decode/default/search.json",
                           "results/frontiers/prefix/cache_off/search.json",
                           "results/frontiers/azure/default/search.json"]
    assert outputs[3] == "results/runs/interference" and outputs[-1] == "results/runs/azure_k5"
    assert {"data/traces/azure2023_conv.csv", "data/schedules/azure_conv.parquet.stats.json"} <= set(inputs)
    assert " job " in shell and "--then" not in shell and "--host" not in shell


def planned_jobs(out: str) -> list[tuple[str, list[str], list[str], str]]:
    """Each job of a dry run with -p, in the order planned: (rule, its inputs, its outputs,
    its shell command)."""
    jobs = []
    for block in re.split(r"\n(?=rule \w+:\n)", out):
        m = re.match(r"rule (\w+):\n", block)
        if m:
            field = {k: re.search(rf"^\s+{k}: (.*)$", block, re.M) for k in ("input", "output")}
            shell = re.search(r"^Shell command: (.*)$", block, re.M)
            jobs.append((m[1], field["input"][1].split(", ") if field["input"] else [],
                         field["output"][1].split(", ") if field["output"] else [], shell[1] if shell else ""))
    return jobs


def by_rule(jobs) -> dict[str, tuple[int, list[str], list[str], str]]:
    """The jobs of rules that plan one job each: rule -> (its place, inputs, outputs, shell)."""
    return {rule: (i, inputs, outputs, shell) for i, (rule, inputs, outputs, shell) in enumerate(jobs)}


def test_command_line_overrides_are_refused(tmp_path):
    proc = snakemake("--snakefile", str(SNAKEFILE), "--directory", str(tmp_path), "-n", "all",
                     "--configfile", str(REPO / "config/cpu.yaml"), "--config", "scrape={interval_s: 1}")
    assert proc.returncode != 0 and "--config overrides" in proc.stdout + proc.stderr


def test_dry_run_plans_one_search_job_per_frontier_setting(tmp_path):
    """Each (frontier, setting) is a job of its own calling `filledfirst frontier run`; its
    search.json goes to ingest (which reads the probe folders through it) and to `all`."""
    configs = [str(REPO / "tests" / "configs" / f) for f in ("e2e.yaml", "frontier.yaml")]
    proc = snakemake("--snakefile", str(SNAKEFILE), "--directory", str(tmp_path), "-n", "-p", "all",
                     "--configfile", *configs)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    stats = job_stats(out)
    assert stats["frontier_knee_default"] == 1 and stats["frontier_knee_seq2"] == 1
    # seq2 is verified: one job per intervention
    assert stats["frontier_knee_seq2_seqs_x2"] == 1 and stats["frontier_knee_seq2_kv_x2"] == 1
    assert stats["ingest"] == 1 and stats["report"] == 1
    jobs = by_rule(planned_jobs(out))
    # each intervention after the search whose knee it starts from
    for setting in ("seq2_seqs_x2", "seq2_kv_x2"):
        assert jobs["frontier_knee_seq2"][0] < jobs[f"frontier_knee_{setting}"][0]
        assert "results/frontiers/knee/seq2/search.json" in jobs[f"frontier_knee_{setting}"][1]
    for setting in ("default", "seq2", "seq2_seqs_x2", "seq2_kv_x2"):
        _, _, outputs, shell = jobs[f"frontier_knee_{setting}"]
        assert outputs == [f"results/frontiers/knee/{setting}/search.json"]
        assert f" job --config {configs[0]} --config {configs[1]} frontier_knee_{setting} --no-progress" in shell
        assert f"tee results/logs/frontier-knee-{setting}.log" in shell
    ingest = next(line for line in out.splitlines() if " -m filledfirst ingest " in line)
    assert "results/frontiers/knee/default/search.json results/frontiers/knee/seq2/search.json" in ingest
    assert "results/frontiers/knee/seq2_kv_x2/search.json" in ingest
    assert "results/runs/reference" in ingest


def test_a_study_without_frontiers_plans_no_search(tmp_path):
    proc = snakemake("--snakefile", str(SNAKEFILE), "--directory", str(tmp_path), "-n", "all",
                     "--configfile", str(REPO / "tests" / "configs" / "e2e.yaml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not [rule for rule in job_stats(proc.stdout + proc.stderr) if rule.startswith("frontier_")]


def test_dry_run_orders_search_then_relative_schedule_then_run(tmp_path):
    """A workload placed relative to a knee (tests/configs/relative.yaml): its schedule job
    takes the search's search.json as input, so the search comes first, then the
    schedule (given the knee file), then the run; or, when the experiment needs the
    search's own server, the search's job runs it."""
    configs = [str(REPO / "tests" / "configs" / f) for f in ("e2e.yaml", "frontier.yaml", "relative.yaml")]
    proc = snakemake("--snakefile", str(SNAKEFILE), "--directory", str(tmp_path), "-n", "-p", "all",
                     "--configfile", *configs)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    planned = planned_jobs(out)
    jobs = by_rule(planned)

    def find(pred):
        return next(i for i, job in enumerate(planned) if pred(*job))

    # past_knee has a server of its own: its schedule job waits for the search, its run for the schedule.
    schedule = find(lambda rule, inputs, outputs, shell: rule.startswith("schedule_")
                    and "data/schedules/twice_knee.parquet" in outputs)
    assert jobs["frontier_knee_default"][0] < schedule < jobs["run_group_past_knee"][0]
    assert "results/frontiers/knee/default/search.json" in planned[schedule][1]
    assert "--workload twice_knee --out" in planned[schedule][3]
    assert "data/schedules/twice_knee.parquet" in jobs["run_group_past_knee"][1]
    # azure_below_knee needs knee/seq2's server: that search's job runs it after the search,
    # its schedule made there from the trace, which is the job's input.
    _, inputs, outputs, shell = jobs["frontier_knee_seq2"]
    assert "data/traces/azure2023_conv.csv" in inputs
    assert outputs == ["results/frontiers/knee/seq2/search.json", "results/runs/azure_below_knee"]
    assert "run_group_azure_below_knee" not in jobs
    # Absolute workloads wait for no search.
    light = find(lambda rule, inputs, outputs, shell: "--workload light " in shell)
    assert not [i for i in planned[light][1] if i.endswith("search.json")]
    azure = find(lambda rule, inputs, outputs, shell: "data/schedules/azure.parquet" in outputs)
    assert not [i for i in planned[azure][1] if i.endswith("search.json")]
