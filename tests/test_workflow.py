"""The Snakemake workflow itself: lint-clean, and both studies plan the right jobs."""

import subprocess
import sys

import pytest

from conftest import REPO


def snakemake(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_lint_is_clean():
    proc = snakemake("--lint", "--configfile", "config/cpu.yaml")
    assert proc.returncode == 0 and "good condition" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


@pytest.mark.parametrize("configfile, model_jobs", [("config/config.yaml", 0), ("config/cpu.yaml", 1)])
def test_dry_run_plans_every_experiment(tmp_path, configfile, model_jobs):
    proc = snakemake("--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path), "-n", "all",
                     "--configfile", str(REPO / configfile))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    stats = {line.split()[0]: int(line.split()[1]) for line in out.splitlines()
             if len(line.split()) == 2 and line.split()[1].isdigit()}
    assert stats["run_experiment"] == 4 and stats["ingest"] == 1 and stats["report"] == 1
    assert stats.get("tiny_model", 0) == model_jobs


def test_command_line_overrides_are_refused(tmp_path):
    proc = snakemake("--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path), "-n", "all",
                     "--configfile", str(REPO / "config/cpu.yaml"), "--config", "scrape={interval_s: 1}")
    assert proc.returncode != 0 and "--config overrides" in proc.stdout + proc.stderr
