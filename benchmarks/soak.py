"""The soak: a 20-minute replay with thousands of requests on the real vLLM CPU engine,
watching whether the client's memory and open file descriptors stay flat.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/soak.py --out /tmp/soak   # about 22 minutes

It runs `filledfirst run` (config benchmarks/soak.yaml: 3,600 short requests, Poisson
at 3 req/s, and a long one every 10 s) in a fresh process and samples that process
(the load generator, its scraper and the server's supervisor; vLLM is a separate
process group and is not counted) every `--every` seconds with psutil: RSS and the
number of open file descriptors. At the end it prints one row per sampled minute and a
summary: RSS and FDs early in the replay (after the first minute, once connection pools
and buffers have grown) against the end, and the request outcomes from the run folder.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pyarrow.parquet as pq

from filledfirst.contracts import runmeta
from filledfirst.run import folder

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "benchmarks" / "soak.yaml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="work folder (never inside the repository)")
    ap.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    args = ap.parse_args()
    work = args.out.resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = work / "data" / "models" / "tiny-qwen2"
    if not (model / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "filledfirst", "model", "tiny", str(model)], check=True)
    schedule = work / "soak.parquet"
    subprocess.run([sys.executable, "-m", "filledfirst", "workload", "synth", "--config", str(CONFIG),
                    "--workload", "soak", "--out", str(schedule)], check=True)
    run_dir = work / "runs" / "soak"
    if run_dir.exists():
        sys.exit(f"{run_dir} exists: remove it or give another --out")
    log = open(work / "run.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "filledfirst", "run", "--config", str(CONFIG), "--experiment", "soak",
         "--schedule", str(schedule), "--out", str(run_dir), "--no-progress"],
        cwd=work, stdout=log, stderr=subprocess.STDOUT,
    )
    client = psutil.Process(proc.pid)
    samples = []
    t0 = time.monotonic()
    t_replay = None
    while proc.poll() is None:
        try:
            with client.oneshot():
                rss, fds, cpu = client.memory_info().rss, client.num_fds(), sum(client.cpu_times()[:2])
        except psutil.NoSuchProcess:
            break
        if t_replay is None and "replaying" in (work / "run.log").read_text(errors="replace"):
            t_replay = time.monotonic()
        if t_replay is not None:
            samples.append({"t_s": time.monotonic() - t_replay, "rss_mb": rss / 2**20, "fds": fds, "cpu_s": cpu})
        time.sleep(args.every)
    proc.wait()
    meta = runmeta.decode(folder.read_run_json(run_dir))
    statuses = Counter(pq.read_table(run_dir / "requests.parquet", columns=["status"]).column("status").to_pylist())
    summary = summarise(samples)
    summary.update({"exit_code": proc.returncode, "run_status": meta.status, "requests": dict(statuses),
                    "wall_s": time.monotonic() - t0, "replay_s": meta.timings.replay_s})
    (work / "soak.json").write_text(json.dumps({"summary": summary, "samples": samples}, indent=1))
    print("| minute | client RSS (MB) | open FDs |\n|---:|---:|---:|")
    for minute in range(int(samples[-1]["t_s"] // 60) + 1):
        row = next(s for s in samples if s["t_s"] >= minute * 60)
        print(f"| {minute} | {row['rss_mb']:.0f} | {row['fds']} |")
    print(json.dumps(summary, indent=1))


def summarise(samples: list[dict]) -> dict:
    """After the first minute against the last minute: growth that scales with the number
    of requests shows as a steady rise between the two."""
    early = [s for s in samples if 60 <= s["t_s"] < 120]
    late = [s for s in samples if s["t_s"] >= samples[-1]["t_s"] - 60]
    mean = lambda rows, k: sum(r[k] for r in rows) / len(rows)  # noqa: E731
    return {
        "samples": len(samples),
        "rss_mb_minute_1": round(mean(early, "rss_mb"), 1),
        "rss_mb_last_minute": round(mean(late, "rss_mb"), 1),
        "rss_mb_max": round(max(s["rss_mb"] for s in samples), 1),
        "fds_minute_1_max": max(s["fds"] for s in early),
        "fds_last_minute_max": max(s["fds"] for s in late),
        "fds_max": max(s["fds"] for s in samples),
        "client_cpu_s": round(samples[-1]["cpu_s"], 1),
    }


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
