"""Results databases for the comparison's tests: a run of synthetic requests, and a
database of runs and knees (table `frontiers` with the columns a knee needs), diagnosed."""

from __future__ import annotations

import duckdb

from filledfirst.analysis.diagnosis import write_diagnosis
from filledfirst.study import DiagnosisRules

from helpers.synthetic_db import every, gauges, make_db, queue


def study_run(run_id, ttft_s=0.05, failed=0, interval_s=0.1):
    reqs = queue(every(interval_s, 200), 0.5, 64, ttft_s=ttft_s)
    for r in reqs[:failed]:
        r.update(status="error", t_first_token=None)
    tokens = {r["request_id"]: [r["t_first_token"] + 0.01 * k for k in range(1, 5)]
              for r in reqs if r["t_first_token"] is not None}
    return {"run_id": run_id, "requests": reqs, "samples": gauges(reqs, 21, lambda n: 0.5 * n), "tokens": tokens,
            "meta": {"part": "decode", "spec": {"server": {"max_num_seqs": 64}}}}


KNEE = "frontier, setting, lo_rps, hi_rps, floor_rps, reason, knee_label, drifted"  # the columns a test sets
# table `frontiers`' columns a knee needs (the SLO and probes too: every row has them)
KNEE_COLUMNS = "frontier VARCHAR, setting VARCHAR, lo_rps DOUBLE, hi_rps DOUBLE, floor_rps DOUBLE, reason VARCHAR, " \
               "knee_label VARCHAR, drifted BOOLEAN, slo_ttft_ms DOUBLE DEFAULT 500, slo_itl_ms DOUBLE DEFAULT 100, " \
               "probes BIGINT DEFAULT 4"


def results_db(path, runs, knees, vllm="0.32.0", host="node-a"):
    for r in runs:
        r["meta"]["versions"] = {"vllm_package": vllm}
        r["meta"]["hardware"] = {"host": host, "cores": 2}
    make_db(path, runs)
    write_diagnosis(path, DiagnosisRules())
    with duckdb.connect(str(path)) as con:
        con.execute(f"CREATE OR REPLACE TABLE frontiers ({KNEE_COLUMNS})")
        for k in knees:
            con.execute(f"INSERT INTO frontiers ({KNEE}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", k)
    return path
