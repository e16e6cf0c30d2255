"""The Snakemake workflow itself: lint-clean, and both studies plan the right jobs."""

import re
import subprocess
import sys

import pytest

from filledfirst.config import load_config, server_groups

from conftest import REPO


def snakemake(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_lint_is_clean():
    proc = snakemake("--lint", "--configfile", "config/cpu.yaml")
    assert proc.returncode == 0 and "good condition" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def job_stats(out: str) -> dict[str, int]:
    """The `Job stats` table of a dry run: rule -> number of jobs."""
    return {line.split()[0]: int(line.split()[1]) for line in out.splitlines()
            if len(line.split()) == 2 and line.split()[1].isdigit()}


@pytest.mark.parametrize("configfile, model_jobs", [("config/config.yaml", 0), ("config/cpu.yaml", 1)])
def test_dry_run_plans_one_job_per_server_group(tmp_path, configfile, model_jobs):
    proc = snakemake("--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path), "-n", "-p", "all",
                     "--configfile", str(REPO / configfile))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    stats = job_stats(out)
    groups = server_groups(load_config([REPO / configfile]))
    assert {rule: n for rule, n in stats.items() if rule.startswith("run_group_")} == {
        f"run_group_{group}": 1 for group in groups
    }
    assert stats["ingest"] == 1 and stats["diagnose"] == 1 and stats["report"] == 1
    assert stats.get("tiny_model", 0) == model_jobs
    # One `filledfirst run` per group, its experiments in config order, each to its own folder.
    runs = [line for line in out.splitlines() if " -m filledfirst run " in line]
    assert len(runs) == len(groups)
    for group, members in groups.items():
        line = next(r for r in runs if f"tee results/logs/run-{group}.log" in r)
        assert re.findall(r"--experiment (\S+)", line) == members
        assert re.findall(r"--out (\S+)", line) == [f"results/runs/{e}" for e in members]
    # The three searches of the default server: one job, one start, each to its own folder.
    assert "frontier_prefix_cache_off" not in stats and "frontier_azure_default" not in stats
    searches = [line for line in out.splitlines() if " -m filledfirst frontier run " in line]
    default = next(line for line in searches if "--frontier decode --setting default " in line)
    assert ("--out results/frontiers/decode/default --then prefix cache_off results/frontiers/prefix/cache_off "
            "--then azure default results/frontiers/azure/default data/traces/azure2023_conv.csv "
            "data/schedules/azure_conv.parquet.stats.json --host interference ") in default
    assert "--host azure_k5 results/runs/azure_k5 " in default


def test_command_line_overrides_are_refused(tmp_path):
    proc = snakemake("--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path), "-n", "all",
                     "--configfile", str(REPO / "config/cpu.yaml"), "--config", "scrape={interval_s: 1}")
    assert proc.returncode != 0 and "--config overrides" in proc.stdout + proc.stderr


def test_dry_run_plans_one_search_job_per_frontier_setting(tmp_path):
    """Each (frontier, setting) is a job of its own calling `filledfirst frontier run`; its
    search.json goes to ingest (which reads the probe folders through it) and to `all`."""
    configs = [str(REPO / "tests" / "configs" / f) for f in ("e2e.yaml", "frontier.yaml")]
    proc = snakemake("--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path), "-n", "-p", "all",
                     "--configfile", *configs)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    stats = job_stats(out)
    assert stats["frontier_knee_default"] == 1 and stats["frontier_knee_seq2"] == 1
    # seq2 is verified: one job per intervention
    assert stats["frontier_knee_seq2_seqs_x2"] == 1 and stats["frontier_knee_seq2_kv_x2"] == 1
    assert stats["ingest"] == 1 and stats["report"] == 1
    searches = [line for line in out.splitlines() if " -m filledfirst frontier run " in line]
    assert len(searches) == 4
    # each intervention after the search whose knee it starts from
    order = [next(s for s in ("seq2_seqs_x2", "seq2_kv_x2", "seq2", "default") if f"--setting {s} " in line)
             for line in searches]
    assert order.index("seq2") < order.index("seq2_seqs_x2") and order.index("seq2") < order.index("seq2_kv_x2")
    for setting in ("default", "seq2", "seq2_seqs_x2", "seq2_kv_x2"):
        line = next(s for s in searches if f"--setting {setting} " in s)
        assert f"--frontier knee --setting {setting} --out results/frontiers/knee/{setting} --no-progress" in line
        assert f"tee results/logs/frontier-knee-{setting}.log" in line
    ingest = next(line for line in out.splitlines() if " -m filledfirst ingest " in line)
    assert "results/frontiers/knee/default/search.json results/frontiers/knee/seq2/search.json" in ingest
    assert "results/frontiers/knee/seq2_kv_x2/search.json" in ingest
    assert "results/runs/reference" in ingest


def test_a_study_without_frontiers_plans_no_search(tmp_path):
    proc = snakemake("--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path), "-n", "all",
                     "--configfile", str(REPO / "tests" / "configs" / "e2e.yaml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not [rule for rule in job_stats(proc.stdout + proc.stderr) if rule.startswith("frontier_")]


def test_dry_run_orders_search_then_relative_schedule_then_run(tmp_path):
    """A workload placed relative to a knee (tests/configs/relative.yaml): its schedule job
    takes the search's search.json as input, so the search comes first, then the
    schedule (given the knee file), then the run; or, when the experiment needs the
    search's own server, the search's job runs it."""
    configs = [str(REPO / "tests" / "configs" / f) for f in ("e2e.yaml", "frontier.yaml", "relative.yaml")]
    proc = snakemake("--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path), "-n", "-p", "all",
                     "--configfile", *configs)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # Each planned job: (rule, its input line, its shell command), in the order planned.
    jobs = []
    for block in re.split(r"\n(?=rule \w+:\n)", out):
        m = re.match(r"rule (\w+):\n", block)
        if m:
            inputs = re.search(r"^\s+input: (.*)$", block, re.M)
            shell = re.search(r"^Shell command: (.*)$", block, re.M)
            jobs.append((m[1], inputs[1] if inputs else "", shell[1] if shell else ""))
    order = [rule for rule, _, _ in jobs]

    def index(pred):
        return next(i for i, job in enumerate(jobs) if pred(*job))

    # past_knee is isolated: its schedule job waits for the search, its run for the schedule.
    search = order.index("frontier_knee_default")
    schedule = index(lambda rule, inputs, shell: rule.startswith("schedule_")
                     and "data/schedules/twice_knee.parquet " in shell)
    run = order.index("run_group_past_knee")
    assert search < schedule < run, order
    assert "results/frontiers/knee/default/search.json" in jobs[schedule][1]
    assert "--knee results/frontiers/knee/default/search.json --out" in jobs[schedule][2]
    assert "data/schedules/twice_knee.parquet" in jobs[run][1]
    # azure_below_knee needs knee/seq2's server: that search's job runs it after the search,
    # its schedule made there from the trace, which is the job's input.
    _, inputs, shell = jobs[order.index("frontier_knee_seq2")]
    assert "data/traces/azure2023_conv.csv" in inputs
    assert ("--host azure_below_knee results/runs/azure_below_knee "
            "--host-trace azure2023_conv data/traces/azure2023_conv.csv --no-progress") in shell
    assert "run_group_azure_below_knee" not in order
    # Absolute workloads wait for no search and are made as before.
    light = index(lambda rule, inputs, shell: "--workload light " in shell)
    assert "--knee" not in jobs[light][2] and "search.json" not in jobs[light][1]
    azure = index(lambda rule, inputs, shell: "data/schedules/azure.parquet " in shell)
    assert "--workload azure --out" in jobs[azure][2] and "--knee" not in jobs[azure][2]
    assert "search.json" not in jobs[azure][1]
