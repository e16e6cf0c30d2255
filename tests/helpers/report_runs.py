"""Small run folders with known signals, ingested and diagnosed: the report's tests
(test_report, test_report_sections, test_security) build their databases from these."""

from __future__ import annotations

from pathlib import Path

from filledfirst.analysis.diagnosis import write_diagnosis
from filledfirst.config import load_study
from filledfirst.contracts.records import (
    RequestRecord,
    SampleRecord,
    TokenRecord,
)
from filledfirst.store.ingest import ingest
from filledfirst.study import DiagnosisRules

from helpers.run_folder import write_run

REPO = Path(__file__).resolve().parents[2]
QMD = REPO / "reports" / "report.qmd"  # the report's source

RUN_A = "interference-0"
RUN_LEGACY = "decode-legacy-0"
RUN_FAILED = "kv-pressure-0"
FAILED_RUN_ERROR = "server never became healthy: <script>alert(1)</script>"
DISCONNECT_ERROR = "<b>connection reset</b> & gone"
HOST = "gpu-node-17.internal"  # what a published report leaves out


def run_meta(run_id: str, experiment: str, status: str, max_num_seqs: int, started: int,
             error: str | None = None, part: str | None = None) -> dict:
    # The run.json shape the runner writes: ingest reads model/server/versions from it and
    # the report's Setup section shows the rest.
    return {
        "run_id": run_id, "experiment": experiment, "workload": experiment.split("-")[0],
        "description": f"{experiment} with max_num_seqs={max_num_seqs}", "status": status,
        "error": error, "started_at": f"2025-01-01T0{started}:00:00Z", "duration_s": 3.0,
        "model": {"name": "tiny-qwen2", "dtype": "float32", "max_model_len": 32768},
        "server": {"launcher": "cpu",
                   "argv": ["python", "-m", "vllm.entrypoints.openai.api_server", "--max-num-seqs",
                            str(max_num_seqs)],
                   "settings": {"max_num_seqs": max_num_seqs, "enable_prefix_caching": False}},
        "versions": {"vllm": "0.32.0", "python": "3.11"},
        "hardware": {"host": HOST, "cpu": "AMD EPYC", "cores": 2, "memory_gib": 24, "gpus": []},
        "timings": {"startup_s": 21.5},
        "schedule": {"n_requests": 7, "span_s": 1.75},
        "part": part, "expect": None, "spec": {"loadgen": {}},
    }


def make_request(rid: int, role: str, t0: float, chunk_ts: list[tuple[float, int]], status: str = "ok",
                 error: str | None = None, timed: bool = False) -> tuple[RequestRecord, list[TokenRecord]]:
    toks = [TokenRecord(rid, i, t, n) for i, (t, n) in enumerate(chunk_ts)]
    first = chunk_ts[0][0] if chunk_ts else None
    last = chunk_ts[-1][0] if chunk_ts else None
    n_out = sum(n for _, n in chunk_ts)
    rec = RequestRecord(
        rid, role, 150, 4, t0, t_sent=t0 + 0.001, t_first_token=first, t_last_token=last,
        t_done=last, prompt_tokens_received=150, output_tokens_received=n_out,
        chunks=len(chunk_ts), status=status, http_status=200 if status == "ok" else None, error=error,
    )
    if timed and first is not None:  # vLLM's own timings: half of TTFT from send queued, 40 % prefill
        from_send_ms = (first - rec.t_sent) * 1000
        rec.server_queue_ms, rec.server_prefill_ms = 0.5 * from_send_ms, 0.4 * from_send_ms
        rec.server_decode_ms = (last - first) * 1000
    return rec, toks


def series(metric: str, per_engine: list[list[float]], ts: list[float]) -> list[SampleRecord]:
    return [
        SampleRecord(t, metric, f"engine={e},model_name=tiny-qwen2", v)
        for e, values in enumerate(per_engine) for t, v in zip(ts, values)
    ]


def run_a(root: Path) -> Path:
    """Two roles, two engines, one disconnected request, counters and scraper rows."""
    built = [
        # decoding: TTFT 40/50/60 ms; gaps 10, 20/2 (a 2-token chunk), 12, 30, 100 ms; the
        # trailing n=0 usage chunk carries no token and makes no gap.
        make_request(0, "decoding", 0.0, [(0.040, 1), (0.050, 1), (0.070, 2), (0.080, 0)], timed=True),
        make_request(1, "decoding", 0.0, [(0.050, 1), (0.062, 1), (0.092, 1)], timed=True),
        make_request(2, "decoding", 0.0, [(0.060, 1), (0.160, 1)], timed=True),
        # probes: TTFT 110/200/800 ms; gaps 5, 8, 6 ms
        make_request(3, "probe", 1.00, [(1.110, 1), (1.115, 1)], timed=True),
        make_request(4, "probe", 1.25, [(1.450, 1), (1.458, 1)], timed=True),
        make_request(5, "probe", 1.50, [(2.300, 1), (2.306, 1)], timed=True),
        # disconnected after streaming: its TTFT (50 ms) and gap (600 ms) must not count
        make_request(6, "probe", 1.75, [(1.800, 1), (2.400, 1)], status="disconnected", error=DISCONNECT_ERROR),
    ]
    ts = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    samples = (
        series("vllm:num_requests_running", [[0, 2, 3, 3, 2, 0], [0, 1, 1, 2, 1, 0]], ts)
        + series("vllm:num_requests_waiting", [[0, 0, 1, 2, 0, 0], [0, 0, 0, 1, 0, 0]], ts)
        + series("vllm:kv_cache_usage_perc",
                  [[0.0, 0.1, 0.2, 0.3, 0.15, 0.0], [0.0, 0.05, 0.25, 0.2, 0.1, 0.0]], ts)
        # counter already at 2 when the run started: only the delta counts
        + series("vllm:num_preemptions_total", [[2, 2, 3, 5, 5, 5], [0, 0, 0, 1, 1, 1]], ts)
        + series("vllm:num_preemptions_created", [[1.7e9] * 6], ts)
        + [SampleRecord(t, "filledfirst:scrape_seconds", "", 0.004) for t in ts]
    )
    meta = run_meta(RUN_A, "interference", "ok", 8, started=1, part="interference")
    return write_run(root / meta["run_id"], meta, [r for r, _ in built], [t for _, ts_ in built for t in ts_],
                     samples)


def run_legacy(root: Path) -> Path:
    """A cut-short run from an older vLLM: gpu_cache name, counter stored without _total."""
    built = [make_request(0, "decode", 0.0, [(0.1, 1), (0.2, 1)]),
             make_request(1, "decode", 0.5, [(0.7, 1), (0.75, 1)])]
    ts = [0.0, 1.0, 2.0]
    samples = (
        series("vllm:num_requests_running", [[1, 2, 1]], ts)
        + series("vllm:num_requests_waiting", [[0, 0, 0]], ts)
        + series("vllm:gpu_cache_usage_perc", [[0.01, 0.02, 0.04]], ts)
        + series("vllm:num_preemptions", [[0, 0, 0]], ts)
    )
    meta = run_meta(RUN_LEGACY, "decode-legacy", "partial", 64, started=2, error="server exited with code -9",
                 part="decode_load")
    return write_run(root / meta["run_id"], meta, [r for r, _ in built], [t for _, ts_ in built for t in ts_],
                     samples)


def failed_run(root: Path) -> Path:
    """A run whose server never started: nothing measured, an error with markup in it."""
    return write_run(root / RUN_FAILED,
                     run_meta(RUN_FAILED, "kv-pressure", "failed", 64, started=3, error=FAILED_RUN_ERROR))


def report_runs(root: Path) -> list[Path]:
    """The three runs of the report's tests: ok, cut short, failed."""
    return [run_a(root), run_legacy(root), failed_run(root)]


def report_db(path: Path, run_dirs: list[Path]) -> Path:
    """The run folders ingested into `path` and diagnosed with the e2e config's parts."""
    ingest(run_dirs, path)
    write_diagnosis(path, DiagnosisRules(), parts=load_study([REPO / "tests" / "configs" / "e2e.yaml"]).sections)
    return path
