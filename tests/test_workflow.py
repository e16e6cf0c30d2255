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
    assert stats["ingest"] == 1 and stats["report"] == 1
    assert stats.get("tiny_model", 0) == model_jobs
    # One `filledfirst run` per group, its experiments in config order, each to its own folder.
    runs = [line for line in out.splitlines() if " -m filledfirst run " in line]
    assert len(runs) == len(groups)
    for group, members in groups.items():
        line = next(r for r in runs if f"tee results/logs/run-{group}.log" in r)
        assert re.findall(r"--experiment (\S+)", line) == members
        assert re.findall(r"--out (\S+)", line) == [f"results/runs/{e}" for e in members]


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
    assert stats["ingest"] == 1 and stats["report"] == 1
    searches = [line for line in out.splitlines() if " -m filledfirst frontier run " in line]
    assert len(searches) == 2
    for setting in ("default", "seq2"):
        line = next(s for s in searches if f"--setting {setting} " in s)
        assert f"--frontier knee --setting {setting} --out results/frontiers/knee/{setting} --no-progress" in line
        assert f"tee results/logs/frontier-knee-{setting}.log" in line
    ingest = next(line for line in out.splitlines() if " -m filledfirst ingest " in line)
    assert "results/frontiers/knee/default/search.json results/frontiers/knee/seq2/search.json" in ingest
    assert "results/runs/reference" in ingest


def test_a_study_without_frontiers_plans_no_search(tmp_path):
    proc = snakemake("--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path), "-n", "all",
                     "--configfile", str(REPO / "tests" / "configs" / "e2e.yaml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not [rule for rule in job_stats(proc.stdout + proc.stderr) if rule.startswith("frontier_")]
