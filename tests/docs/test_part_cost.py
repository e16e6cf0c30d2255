"""benchmarks/part_cost.py, the measure of what a part of the study costs: its reading of a
Snakemake log and of the part's paths, on a log written here and on the CPU study."""

from __future__ import annotations

import importlib.util
import json
import sys

from filledfirst.config import load_study

from conftest import REPO

_spec = importlib.util.spec_from_file_location("part_cost", REPO / "benchmarks" / "part_cost.py")
part_cost = sys.modules["part_cost"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(part_cost)

LOG = """\
Select jobs to execute...
[Thu Dec  3 10:00:00 2026]
rule frontier_decode_default:
    output: results/frontiers/decode/default/search.json, results/frontiers/prefix/cache_off/search.json
    jobid: 3
    reason: Missing output files
[Thu Dec  3 10:05:00 2026]
Finished jobid: 3 (Rule: frontier_decode_default)
[Thu Dec  3 10:05:00 2026]
rule frontier_prefix_cache_on:
    output: results/frontiers/prefix/cache_on/search.json, results/runs/mooncake_cache_on
    jobid: 4
[Thu Dec  3 10:06:10 2026]
Finished job 4.
[Thu Dec  3 10:06:10 2026]
localrule report:
    output: reports/report.html
    jobid: 9
[Thu Dec  3 10:06:40 2026]
Error in rule report:
"""


def test_jobs_of_reads_each_finished_job(tmp_path):
    log = tmp_path / "x.snakemake.log"
    log.write_text(LOG)
    jobs = {j.jobid: j for j in part_cost.jobs_of(log)}
    assert set(jobs) == {3, 4}  # the report never finished
    assert jobs[3].seconds == 300 and jobs[4].seconds == 70
    assert jobs[4].outputs == ["results/frontiers/prefix/cache_on/search.json", "results/runs/mooncake_cache_on"]


def test_part_paths_of_the_prefix_part():
    runs, inputs = part_cost.part_paths(load_study([REPO / "config" / "cpu.yaml"]), "prefix_cache")
    assert "results/frontiers/prefix/" in runs
    assert {"results/runs/mooncake_cache_off", "results/runs/mooncake_cache_on", "results/runs/prefix_evicted"} <= runs
    assert not any("decode" in r or "azure" in r for r in runs)
    assert "data/schedules/mooncake_conv.parquet" in inputs
    assert not any("azure" in i for i in inputs)  # the Azure trace is the rest's too


def test_a_shared_job_counts_only_the_parts_runs(tmp_path):
    """In a job the part shares, the part's cost is its runs' span, not the job."""
    folder = tmp_path / "results/frontiers/prefix/cache_off"
    for tag, start, end in [("estimate", "10:01:00", "10:01:20"), ("p1", "10:01:25", "10:01:40")]:
        (folder / tag).mkdir(parents=True)
        (folder / tag / "run.json").write_text(json.dumps(
            {"started_at": f"2026-12-03T{start}+00:00", "finished_at": f"2026-12-03T{end}+00:00"}))
    assert part_cost._span([folder / "search.json"]) == 40
    assert part_cost._belongs("results/frontiers/prefix/cache_off/search.json", {"results/frontiers/prefix/"}, set())
    assert not part_cost._belongs("results/runs/mooncake_cache_on_x", {"results/runs/mooncake_cache_on"}, set())
