"""How exact and how cheap is our load generator? Measured against benchmarks/sse_double.py,
a loopback test double that streams at known times (the thing under test is the client).

    .venv/bin/python benchmarks/client_fidelity.py --rates 50 100 200 400 --seconds 15

For each rate (Poisson arrivals, one client process, open loop), each request streaming
`--tokens` chunks at `--itl-ms` after `--ttft-ms`: dispatch lag (send - scheduled), the
error of every chunk's timestamp (client receive - double's emit, one CLOCK_MONOTONIC),
the error of each measured ITL gap, requests or chunks lost, and client CPU per 1,000
streamed tokens. The ceiling is the highest rate whose dispatch lag p99 stays under 5 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from filledfirst.loadgen.replay import Replay
from filledfirst.loadgen.settings import ReplaySettings
from filledfirst.records import ScheduledRequest
from filledfirst.workloads.arrivals import arrival_times

HERE = Path(__file__).resolve().parent


def measure(rate: float, seconds: float, tokens: int, ttft_ms: float, itl_ms: float, use_uvloop: bool) -> dict:
    emit_log = Path(tempfile.mkstemp(suffix=".json")[1])
    double = subprocess.Popen(
        [sys.executable, str(HERE / "sse_double.py"), "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms),
         "--emit-log", str(emit_log)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        port = int(double.stdout.readline())
        n = int(rate * seconds)
        times = arrival_times(n, 0.5, 1.0 / rate, "poisson", seed=1)
        schedule = [ScheduledRequest(i, float(t), 8, tokens, "probe") for i, t in enumerate(times)]
        settings = ReplaySettings(model="double", token_low=10, token_high=20, request_timeout_s=60,
                                  drain_timeout_s=60)
        replay = Replay(schedule, f"http://127.0.0.1:{port}", settings, progress=False)
        if use_uvloop:
            import uvloop

            uvloop.run(replay.run())
        else:
            asyncio.run(replay.run())
    finally:
        double.stdin.close()
        double.wait(timeout=60)
    emitted = {rid: (t_recv, t) for rid, t_recv, t in json.loads(emit_log.read_text())}
    emit_log.unlink()

    t0 = replay._t0  # the replay's clock zero, on the same CLOCK_MONOTONIC as the double
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
    return {
        "loop": "uvloop" if use_uvloop else "asyncio",
        "rate": rate,
        "requests": n,
        "not_ok": sum(r.status != "ok" for r in replay.requests),
        "chunks_lost": n * tokens - len(replay.tokens),
        "lag_p50_ms": float(np.percentile(lag, 50)),
        "lag_p99_ms": float(np.percentile(lag, 99)),
        "chunk_err_p50_ms": float(np.percentile(chunk_err, 50)) if len(chunk_err) else None,
        "chunk_err_p99_ms": float(np.percentile(chunk_err, 99)) if len(chunk_err) else None,
        "itl_err_p99_ms": float(np.percentile(itl_err, 99)) if len(itl_err) else None,
        "cpu_ms_per_1k_tokens": replay.client_cpu_s / n_tokens * 1e6 if n_tokens else None,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rates", type=float, nargs="+", default=[50, 100, 200, 400])
    p.add_argument("--seconds", type=float, default=15)
    p.add_argument("--tokens", type=int, default=100)
    p.add_argument("--ttft-ms", type=float, default=50)
    p.add_argument("--itl-ms", type=float, default=20)
    p.add_argument("--loop", choices=["asyncio", "uvloop", "both"], default="both")
    args = p.parse_args()
    loops = [False, True] if args.loop == "both" else [args.loop == "uvloop"]
    # Interleaved, so both loops see the same machine state.
    rows = [measure(r, args.seconds, args.tokens, args.ttft_ms, args.itl_ms, u) for r in args.rates for u in loops]
    cols = ["loop", "rate", "requests", "not_ok", "chunks_lost", "lag_p50_ms", "lag_p99_ms", "chunk_err_p50_ms",
            "chunk_err_p99_ms", "itl_err_p99_ms", "cpu_ms_per_1k_tokens"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for row in rows:
        print("| " + " | ".join(f"{row[c]:.2f}" if isinstance(row[c], float) else str(row[c]) for c in cols) + " |")
    for loop in sorted({r["loop"] for r in rows}):
        ok = [r["rate"] for r in rows if r["loop"] == loop and r["lag_p99_ms"] < 5]
        print(f"{loop}: ceiling (highest rate with dispatch lag p99 < 5 ms): "
              f"{max(ok) if ok else 'below the lowest rate'} req/s")


if __name__ == "__main__":
    main()
