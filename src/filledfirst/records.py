"""The contracts between stages: one definition of every record that crosses a stage.

A stage writes these tables and the next stage reads them; nothing else is shared.
Times are seconds on one monotonic clock whose zero is the start of the run.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import pyarrow as pa

# A request's fate. Failed ones stay in every table and every denominator; `not_sent`
# marks requests a cut-short run never reached, so a partial run still shows its schedule.
STATUSES = ("ok", "http_error", "timeout", "disconnected", "rejected", "not_sent")

SCHEDULE_SCHEMA = pa.schema(
    [
        ("request_id", pa.int64()),
        ("t_offset_s", pa.float64()),
        ("prompt_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("role", pa.string()),
    ]
)


@dataclass(slots=True)
class ScheduledRequest:
    request_id: int
    t_offset_s: float
    prompt_tokens: int
    output_tokens: int
    role: str


@dataclass(slots=True)
class RequestRecord:
    request_id: int
    role: str
    prompt_tokens: int
    output_tokens: int
    t_scheduled: float
    t_sent: float | None = None
    t_first_token: float | None = None
    t_last_token: float | None = None
    t_done: float | None = None
    prompt_tokens_received: int | None = None
    output_tokens_received: int | None = None
    chunks: int = 0
    status: str = "ok"
    http_status: int | None = None
    error: str | None = None


REQUEST_SCHEMA = pa.schema(
    [
        ("request_id", pa.int64()),
        ("role", pa.string()),
        ("prompt_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("t_scheduled", pa.float64()),
        ("t_sent", pa.float64()),
        ("t_first_token", pa.float64()),
        ("t_last_token", pa.float64()),
        ("t_done", pa.float64()),
        ("prompt_tokens_received", pa.int64()),
        ("output_tokens_received", pa.int64()),
        ("chunks", pa.int64()),
        ("status", pa.string()),
        ("http_status", pa.int64()),
        ("error", pa.string()),
    ]
)


@dataclass(slots=True)
class TokenRecord:
    """One streamed chunk; `n` is how many tokens it carried (usually one)."""

    request_id: int
    index: int
    t: float
    n: int


TOKEN_SCHEMA = pa.schema(
    [("request_id", pa.int64()), ("index", pa.int64()), ("t", pa.float64()), ("n", pa.int64())]
)


@dataclass(slots=True)
class SampleRecord:
    """One scraped Prometheus sample; `labels` is a sorted k=v string for grouping."""

    t: float
    metric: str
    labels: str
    value: float


SAMPLE_SCHEMA = pa.schema(
    [("t", pa.float64()), ("metric", pa.string()), ("labels", pa.string()), ("value", pa.float64())]
)


def to_table(records: list, schema: pa.Schema) -> pa.Table:
    """Column-wise build so an empty list still yields a typed, empty table."""
    names = schema.names
    if records:
        assert [f.name for f in fields(records[0])] == names, "record and schema disagree"
    cols = {n: [getattr(r, n) for r in records] for n in names}
    return pa.table(cols, schema=schema)
