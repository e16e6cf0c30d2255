"""Synthetic runs written straight into a study database, no run folder between: request
rows of a FIFO queue and the scheduler gauges derived from the same times, so the
diagnosis, the frontiers table and the report read runs whose signals agree by
construction (Little's law holds unless a test miscounts on purpose)."""

from __future__ import annotations

import heapq
import json

import duckdb
import polars as pl

from filledfirst.analysis.diagnosis import diagnose
from filledfirst.store.ingest import DDL
from filledfirst.study import DiagnosisRules

RUNNING, WAITING, KV = "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"


def queue(arrivals, service_s, servers, ttft_s=0.05, prompt=150, output=100, role="decode", start_id=0):
    """A FIFO queue with `servers` slots: request rows whose times agree with the gauges
    `gauges` derives from them (so Little's law holds by construction)."""
    free = [0.0] * servers
    rows = []
    for i, t in enumerate(arrivals):
        start = max(t, heapq.heappop(free))
        heapq.heappush(free, start + service_s)
        rows.append(request(start_id + i, t, start + ttft_s, start + service_s, role=role, prompt=prompt,
                            output=output, start=start))
    return rows


def request(rid, t, t_first, t_done, role="decode", prompt=150, output=100, start=None, status="ok", t_sent=None):
    return {"request_id": rid, "role": role, "prompt_tokens": prompt, "output_tokens": output, "t_scheduled": t,
            "t_sent": t if t_sent is None else t_sent, "t_first_token": t_first, "t_done": t_done, "status": status,
            "_start": t if start is None else start}


def gauges(rows, t_end, kv_pct, dt=0.25, scale=1.0):
    """running / waiting / KV every `dt` from the requests' own times; `scale` miscounts."""
    out = []
    for k in range(int(t_end / dt) + 1):
        t = k * dt
        running = sum(r["_start"] <= t < r["t_done"] for r in rows)
        waiting = sum(r["t_scheduled"] <= t < r["_start"] for r in rows)
        out += [(t, RUNNING, running * scale), (t, WAITING, waiting * scale), (t, KV, kv_pct(running) / 100)]
    return out


FRONT_S = 0.002  # HTTP and the API server, both ways


def timed(row, queue_s=None, front_s=FRONT_S):
    """The row with the timings vLLM would send: its queue from when the engine took it in
    (a front end after the send) to its service start (synthetic_db.queue's `_start`), or
    `queue_s`; the prefill is what is left of its TTFT from send."""
    from_send = row["t_first_token"] - row["t_sent"]
    if queue_s is None:
        queue_s = max(row["_start"] - row["t_sent"] - front_s / 2, 0.0)
    prefill_s = from_send - queue_s - front_s
    assert prefill_s >= 0, row
    return row | {"server_queue_ms": queue_s * 1000, "server_prefill_ms": prefill_s * 1000,
                  "server_decode_ms": (row["t_done"] - row["t_first_token"]) * 1000, "server_itl_ms": 10.0}


def series(t_end, running, waiting, kv_pct, dt=0.25):
    """Gauges given directly as functions of time."""
    times = [k * dt for k in range(int(t_end / dt) + 1)]
    return [s for t in times for s in ((t, RUNNING, running(t)), (t, WAITING, waiting(t)), (t, KV, kv_pct(t) / 100))]


STEPS, STEP_TOKENS = "vllm:iteration_tokens_total_count", "vllm:iteration_tokens_total_sum"


def step_counters(t_end, steps, dt=0.25):
    """The step histogram's count and sum, cumulative, at every scrape: `steps(t)` gives the
    (steps, tokens) of the interval ending at t."""
    n = tokens = 0.0
    out = []
    for k in range(int(t_end / dt) + 1):
        t = k * dt
        d_steps, d_tokens = steps(t) if k else (0, 0)
        n, tokens = n + d_steps, tokens + d_tokens
        out += [(t, STEPS, n), (t, STEP_TOKENS, tokens)]
    return out


def make_db(path, runs):
    """runs: dicts with run_id, requests, samples and optional status, error, cap, meta, tokens."""
    con = duckdb.connect(str(path))
    con.execute(DDL)
    for i, run in enumerate(runs):
        run_id = run["run_id"]
        con.execute("INSERT INTO runs (run_id, experiment, status, error, started_at, max_num_seqs, meta) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [run_id, run_id, run.get("status", "ok"), run.get("error"), f"2026-01-01T00:00:{i:02d}",
                     run.get("cap", 64), json.dumps(run.get("meta", {}))])
        reqs = [{k: v for k, v in r.items() if not k.startswith("_")} | {"run_id": run_id} for r in run["requests"]]
        # a sample is (t, metric, value) or (t, metric, value, labels)
        samples = [{"run_id": run_id, "t": t, "metric": m,
                    "value": float(v), "labels": rest[0] if rest else run.get("labels", {}).get(m, "engine=0")}
                   for t, m, v, *rest in run["samples"]]
        # a chunk is a time (one token) or (time, tokens)
        tokens = [{"run_id": run_id, "request_id": rid, "index": k, "t": float(c[0] if isinstance(c, tuple) else c),
                   "n": c[1] if isinstance(c, tuple) else 1}
                  for rid, chunks in run.get("tokens", {}).items() for k, c in enumerate(chunks)]
        for table, rows in (("requests", reqs), ("samples", samples), ("tokens", tokens)):
            if rows:
                con.register("_rows", pl.DataFrame(rows).to_arrow())
                con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _rows")
                con.unregister("_rows")
    con.close()
    return path


def run_of(tmp_path, rules=DiagnosisRules(), **run) -> dict:
    db = make_db(tmp_path / f"{run['run_id']}.duckdb", [run])
    with duckdb.connect(str(db), read_only=True) as con:
        return diagnose(con, rules).to_dicts()[0]


def every(gap, n, t0=0.0):
    return [t0 + gap * i for i in range(n)]


def reference_run(run_id="ref"):
    reqs = queue(every(0.1, 200), 0.5, 64)
    return {"run_id": run_id, "requests": reqs, "samples": gauges(reqs, 21, lambda n: 0.5 * n)}


def kv_pressure_run(run_id="kv"):
    reqs = queue(every(0.05, 300), 1.0, 10, prompt=900, output=300)  # only ten fit in KV
    samples = gauges(reqs, 32, lambda n: 9.6 * n)
    samples += [(t, "vllm:num_preemptions_total", t // 3) for t, m, _ in samples if m == RUNNING]
    return {"run_id": run_id, "requests": reqs, "samples": samples}


def interference_run(run_id="int", probe_ttft=1.5):
    reqs = [request(i, 0.05 * i, 0.05 * i + 0.04, 30.0, role="decoding") for i in range(12)]
    reqs += [request(12 + i, 2.0, 4.0, 4.1, role="long_prompt", prompt=4000, output=16) for i in range(3)]
    for i, t in enumerate(every(0.25, 32, 2.1)):
        ttft = probe_ttft if t <= 4.0 else 0.05  # behind the long prefills, or not
        reqs.append(request(15 + i, t, t + ttft, t + ttft + 0.3, role="probe"))
    return {"run_id": run_id, "requests": reqs, "samples": gauges(reqs, 31, lambda n: 0.5 * n)}
