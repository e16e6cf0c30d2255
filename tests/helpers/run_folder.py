"""Run folders as the runner leaves them, for the tests that read one (ingest, the report,
the client checks): the measured tables, if any, then run.json last."""

from __future__ import annotations

from pathlib import Path

from filledfirst import atomic
from filledfirst.contracts.records import (
    REQUEST_SCHEMA,
    SAMPLE_SCHEMA,
    TOKEN_SCHEMA,
    RequestRecord,
    SampleRecord,
    TokenRecord,
    to_table,
)
from filledfirst.run import folder


def write_run(path: Path, meta: dict, requests: list[RequestRecord] | None = None,
              tokens: list[TokenRecord] = (), samples: list[SampleRecord] = ()) -> Path:
    """The folder `path` with run.json `meta`; with `requests`, the three tables too (a run
    that measured nothing, such as one whose server never started, has only run.json)."""
    path.mkdir(parents=True)
    if requests is not None:
        atomic.write_parquet(to_table(list(requests), REQUEST_SCHEMA), path / folder.REQUESTS)
        atomic.write_parquet(to_table(list(tokens), TOKEN_SCHEMA), path / folder.TOKENS)
        atomic.write_parquet(to_table(list(samples), SAMPLE_SCHEMA), path / folder.SAMPLES)
    atomic.write_json(meta, path / folder.RUN_JSON)
    return path


def make_run(path: Path, run_id: str, status: str = "ok", n: int = 5) -> Path:
    """A small finished run: `n` requests 0.1 s apart, 4 tokens in 3 chunks each, one token
    row, no samples, and the least run.json ingest takes."""
    reqs = [RequestRecord(i, "decode", 10, 4, 0.1 * i, 0.1 * i, 0.1 * i + 0.05, 0.1 * i + 0.08, 0.1 * i + 0.09,
                          10, 4, 3)
            for i in range(n)]
    meta = {"run_id": run_id, "experiment": run_id.split("-")[0], "status": status}
    return write_run(path, meta, reqs, [TokenRecord(0, 0, 0.05, 1)])
