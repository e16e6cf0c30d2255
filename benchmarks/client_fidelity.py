"""How exact and how cheap is our load generator? Measured against tests/helpers/stream_double.py,
the loopback test double of the tests, which streams at known times (the thing under test is
the client).

    .venv/bin/python benchmarks/client_fidelity.py --rates 25 50 100 200 --seconds 5 --loop asyncio

For each rate (Poisson arrivals, one client process, open loop), each request streaming
`--tokens` chunks at `--itl-ms` after `--ttft-ms`: dispatch lag (send - scheduled), the
error of every chunk's timestamp (client receive - double's emit, one CLOCK_MONOTONIC),
the error of each measured ITL gap, requests or chunks lost, client CPU per 1,000
streamed tokens, and the double's CPU per 1,000 tokens over the same replay (its process's
user + system time, from psutil), with the ratio double / client: the double must cost
at most a fifth of the client, or the benchmark measures the double. The ceiling is the
highest rate whose dispatch lag p99 stays under 5 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import psutil

from filledfirst.contracts.records import ScheduledRequest
from filledfirst.loadgen.replay import Replay
from filledfirst.loadgen.settings import ReplaySettings
from filledfirst.workloads.arrivals import arrival_times

HERE = Path(__file__).resolve().parent
DOUBLE = HERE.parent / "tests" / "helpers" / "stream_double.py"


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def measure(rate: float, seconds: float, tokens: int, ttft_ms: float, itl_ms: float, use_uvloop: bool,
            double_loop: str, tick_ms: float, double_script: Path = DOUBLE, workers: int = 1,
            profile: Path | None = None) -> dict:
    emit_log = Path(tempfile.mkstemp(suffix=".json")[1])
    ours = ["--loop", double_loop, "--tick-ms", str(tick_ms)] if double_script == DOUBLE else []
    double = subprocess.Popen(
        [sys.executable, str(double_script), "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms),
         "--emit-log", str(emit_log), *ours],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        port = int(double.stdout.readline())
        double_proc = psutil.Process(double.pid)
        n = int(rate * seconds)
        times = arrival_times(n, 0.5, 1.0 / rate, "poisson", seed=1)
        schedule = [ScheduledRequest(i, float(t), 8, tokens, "probe") for i, t in enumerate(times)]
        settings = ReplaySettings(model="double", token_low=10, token_high=20, request_timeout_s=60,
                                  drain_timeout_s=60, workers=workers)
        replay = Replay(schedule, f"http://127.0.0.1:{port}", settings, progress=False)
        double_cpu0 = cpu_seconds(double_proc)
        profiler = cProfile.Profile() if profile is not None else None
        if profiler is not None:
            profiler.enable()
        if use_uvloop:
            import uvloop

            uvloop.run(replay.run())
        else:
            asyncio.run(replay.run())
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile)
        double_cpu = cpu_seconds(double_proc) - double_cpu0  # the same span as the client's, give or take
    finally:
        double.stdin.close()
        double.wait(timeout=60)
    emitted = {rid: (t_recv, t) for rid, t_recv, t in json.loads(emit_log.read_text())}
    emit_log.unlink()

    t0 = replay.sender.t0  # the replay's clock zero, on the same CLOCK_MONOTONIC as the double
    lag = np.array([r.t_sent - r.t_scheduled for r in replay.requests if r.t_sent is not None]) * 1e3
    got: dict[int, list[float]] = {}
    for k in replay.tokens:
        got.setdefault(k.request_id, []).append(t0 + k.t)
    chunk_err, itl_err = [], []
    for r in replay.requests:
        _, sent = emitted.get(f"ff-{r.request_id}", (None, []))
        recv = got.get(r.request_id, [])
        if len(sent) == len(recv):
            chunk_err.extend(np.subtract(recv, sent))
            itl_err.extend(np.diff(recv) - np.diff(sent))
    chunk_err = np.array(chunk_err) * 1e3
    itl_err = np.abs(np.array(itl_err)) * 1e3
    n_tokens = sum(k.n for k in replay.tokens)
    client_ms = replay.client_cpu_s / n_tokens * 1e6 if n_tokens else None
    double_ms = double_cpu / n_tokens * 1e6 if n_tokens else None
    return {
        "double": double_script.stem,
        "loop": "uvloop" if use_uvloop else "asyncio",
        "workers": replay.workers,
        "rate": rate,
        "requests": n,
        "not_ok": sum(r.status != "ok" for r in replay.requests),
        "chunks_lost": n * tokens - len(replay.tokens),
        "lag_p50_ms": float(np.percentile(lag, 50)),
        "lag_p99_ms": float(np.percentile(lag, 99)),
        "chunk_err_p50_ms": float(np.percentile(chunk_err, 50)) if len(chunk_err) else None,
        "chunk_err_p99_ms": float(np.percentile(chunk_err, 99)) if len(chunk_err) else None,
        "itl_err_p99_ms": float(np.percentile(itl_err, 99)) if len(itl_err) else None,
        "cpu_ms_per_1k_tokens": client_ms,
        # the busiest process's CPU over the replay: a full core is 1.0
        "peak_cpu_share": replay.client_cpu_peak_s / replay.t_end if replay.t_end else None,
        "double_cpu_ms_per_1k_tokens": double_ms,
        "double_over_client": double_ms / client_ms if client_ms else None,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rates", type=float, nargs="+", default=[50, 100, 200, 400])
    p.add_argument("--seconds", type=float, default=15)
    p.add_argument("--tokens", type=int, default=100)
    p.add_argument("--ttft-ms", type=float, default=50)
    p.add_argument("--itl-ms", type=float, default=20)
    p.add_argument("--loop", choices=["asyncio", "uvloop", "both"], default="both", help="the client's event loop")
    p.add_argument("--double-loop", choices=["uvloop", "asyncio"], default="uvloop", help="the double's event loop")
    p.add_argument("--tick-ms", type=float, default=1.0,
                   help="the double's timer resolution: streams due in the same tick are written together")
    p.add_argument("--workers", type=int, nargs="+", default=[1],
                   help="client processes (loadgen.workers) to compare, interleaved")
    p.add_argument("--profile", type=Path, metavar="DIR",
                   help="cProfile the client's main process, one file per measurement in DIR (top entries printed)")
    p.add_argument("--doubles", type=Path, nargs="+", default=[DOUBLE],
                   help="double scripts to compare, interleaved (each takes --ttft-ms, --itl-ms and --emit-log "
                   "and prints its port); default: the tests' double")
    args = p.parse_args()
    loops = [False, True] if args.loop == "both" else [args.loop == "uvloop"]
    doubles = [d.resolve() for d in args.doubles]
    # Interleaved, so every loop and double sees the same machine state.
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    rows = []
    for r in args.rates:
        for d in doubles:
            for u in loops:
                for w in args.workers:
                    prof = (args.profile / f"{d.stem}-{'uvloop' if u else 'asyncio'}-w{w}-{r:g}.prof"
                            if args.profile else None)
                    rows.append(measure(r, args.seconds, args.tokens, args.ttft_ms, args.itl_ms, u,
                                        args.double_loop, args.tick_ms, d, w, prof))
                    if prof is not None:
                        print(f"== {prof.name}: top 20 by own time")
                        pstats.Stats(str(prof)).sort_stats("tottime").print_stats(20)
    cols = ["double", "loop", "workers", "rate", "requests", "not_ok", "chunks_lost", "lag_p50_ms", "lag_p99_ms",
            "chunk_err_p50_ms", "chunk_err_p99_ms", "itl_err_p99_ms", "cpu_ms_per_1k_tokens", "peak_cpu_share",
            "double_cpu_ms_per_1k_tokens", "double_over_client"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for row in rows:
        print("| " + " | ".join(f"{row[c]:.2f}" if isinstance(row[c], float) else str(row[c]) for c in cols) + " |")
    for double in dict.fromkeys(r["double"] for r in rows):
        mine = [r for r in rows if r["double"] == double]
        ratios = [r["double_over_client"] for r in mine if r["double_over_client"] is not None]
        if ratios:
            print(f"{double}: its CPU per 1,000 tokens over the client's: {min(ratios):.2f} to {max(ratios):.2f} "
                  "(the target: at most 0.20)")
        for loop, workers in sorted({(r["loop"], r["workers"]) for r in mine}):
            ok = [r["rate"] for r in mine if (r["loop"], r["workers"]) == (loop, workers) and r["lag_p99_ms"] < 5]
            print(f"{double}, client on {loop}, {workers} process(es): ceiling (highest rate with dispatch lag "
                  f"p99 < 5 ms): {max(ok) if ok else 'below the lowest rate'} req/s")


if __name__ == "__main__":
    main()
