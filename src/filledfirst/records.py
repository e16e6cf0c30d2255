"""The contracts between stages: one definition of every record that crosses a stage.

A stage writes these tables and the next stage reads them; nothing else is shared.
Times are seconds on one monotonic clock whose zero is the start of the run.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass, fields

import pyarrow as pa

# A request's fate. Failed ones stay in every table and every denominator; `not_sent`
# marks requests a cut-short run never reached, so a partial run still shows its schedule.
STATUSES = ("ok", "http_error", "timeout", "disconnected", "rejected", "not_sent")


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
    # First token of any kind; then the first content token (later when the model reasons first).
    t_first_token: float | None = None
    t_first_content: float | None = None
    t_last_token: float | None = None
    t_done: float | None = None
    prompt_tokens_received: int | None = None
    output_tokens_received: int | None = None
    chunks: int = 0
    reasoning_tokens: int = 0  # counted apart from content: real cost the user never sees
    status: str = "ok"
    http_status: int | None = None
    error: str | None = None
    # 1 when the first attempt hit a keep-alive connection the server had already closed
    # and the request was sent again on a fresh one; `t_sent` stays the first attempt's.
    retries: int = 0



@dataclass(slots=True)
class TokenRecord:
    """One streamed chunk; `n` is how many tokens it carried (usually one)."""

    request_id: int
    index: int
    t: float
    n: int



@dataclass(slots=True)
class SampleRecord:
    """One scraped Prometheus sample; `labels` is a sorted k=v string for grouping."""

    t: float
    metric: str
    labels: str
    value: float



_ARROW = {int: pa.int64(), float: pa.float64(), str: pa.string()}


def arrow_schema(record_type: type) -> pa.Schema:
    """The Arrow schema of a record dataclass: the one definition is the dataclass."""
    out = []
    for name, hint in typing.get_type_hints(record_type).items():
        if isinstance(hint, types.UnionType):  # `int | None`: the column is nullable anyway
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        out.append((name, _ARROW[hint]))
    return pa.schema(out)


SCHEDULE_SCHEMA = arrow_schema(ScheduledRequest)
REQUEST_SCHEMA = arrow_schema(RequestRecord)
TOKEN_SCHEMA = arrow_schema(TokenRecord)
SAMPLE_SCHEMA = arrow_schema(SampleRecord)


def to_table(records: list, schema: pa.Schema) -> pa.Table:
    """Column-wise build so an empty list still yields a typed, empty table."""
    names = schema.names
    if records:
        assert [f.name for f in fields(records[0])] == names, "record and schema disagree"
    cols = {n: [getattr(r, n) for r in records] for n in names}
    return pa.table(cols, schema=schema)
