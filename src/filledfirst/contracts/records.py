"""The contracts between stages: one definition of every record that crosses a stage.

A stage writes these tables and the next stage reads them; nothing else is shared.
Times are seconds on one monotonic clock whose zero is the start of the run.
"""

from __future__ import annotations

import types
import typing
from array import array
from dataclasses import dataclass, fields

import numpy as np
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
    # A prompt made of shared prefix blocks (a trace with prefix structure): block i of the
    # prompt is the tokens of block id prefix_blocks[i], block_tokens each; the tail past
    # the listed blocks is the request's own. () and 0 where the schedule has none.
    prefix_blocks: tuple[int, ...] = ()
    block_tokens: int = 0
    # The prompt tokens an unbounded prefix cache would hold for it by its arrival: whole
    # blocks whose prefix an earlier request of the schedule sent (filledfirst.trace.prefix).
    ideal_cached_tokens: int = 0


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
    # vLLM's own timings of this request (filledfirst.metrics.PER_REQUEST), in ms on the
    # server's clock; None when the server sent none (other servers, older vLLM, vLLM
    # without --enable-per-request-metrics, a stream that ended early).
    server_queue_ms: float | None = None
    server_prefill_ms: float | None = None
    server_decode_ms: float | None = None
    server_itl_ms: float | None = None
    # Prompt tokens the server served from its prefix cache (vLLM: usage.prompt_tokens_details.
    # cached_tokens, with --enable-prompt-tokens-details); None where it did not say.
    cached_tokens: int | None = None
    # What an unbounded cache would have served (the schedule's ideal_cached_tokens).
    ideal_cached_tokens: int | None = None


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
        if typing.get_origin(hint) is tuple:  # `tuple[int, ...]`: a list column
            out.append((name, pa.list_(_ARROW[typing.get_args(hint)[0]])))
            continue
        out.append((name, _ARROW[hint]))
    return pa.schema(out)


SCHEDULE_SCHEMA = arrow_schema(ScheduledRequest)
REQUEST_SCHEMA = arrow_schema(RequestRecord)
TOKEN_SCHEMA = arrow_schema(TokenRecord)
SAMPLE_SCHEMA = arrow_schema(SampleRecord)


class RecordColumns:
    """Records of one dataclass kept column-wise, for the tables that grow with the run
    (streamed chunks, scraped samples): 8 bytes a number and 4 a string, each distinct
    string stored once, where a record object with numbers and strings of its own takes
    100-250 bytes. Held as objects, a 20-minute replay's samples (a vLLM /metrics page
    has hundreds, read four times a second) grew the load generator by 480 MB
    (benchmarks/soak.py). Appends and iterates as the records themselves."""

    _CODES = {int: "q", float: "d", str: "i"}  # a string column holds codes into `_names`

    def __init__(self, record_type: type):
        hints = typing.get_type_hints(record_type)
        assert all(h in self._CODES for h in hints.values()), f"{record_type.__name__}: only int, float, str fields"
        self.record_type = record_type
        self.schema = arrow_schema(record_type)
        self._fields = list(hints)
        self._is_str = [hints[n] is str for n in self._fields]
        self._cols = [array(self._CODES[hints[n]]) for n in self._fields]
        self._codes: dict[str, int] = {}
        self._names: list[str] = []

    def _code(self, name: str) -> int:
        code = self._codes.get(name)
        if code is None:
            code = self._codes[name] = len(self._names)
            self._names.append(name)
        return code

    def append(self, record) -> None:
        n = len(self)
        try:
            for name, is_str, col in zip(self._fields, self._is_str, self._cols):
                value = getattr(record, name)
                col.append(self._code(value) if is_str else value)
        except BaseException:
            for col in self._cols:  # a bad value leaves no column longer than the others
                del col[n:]
            raise

    def extend(self, records) -> None:
        for record in records:
            self.append(record)

    def __len__(self) -> int:
        return len(self._cols[0])

    def __iter__(self):
        names = self._names
        for row in zip(*self._cols):
            yield self.record_type(*(names[v] if is_str else v for v, is_str in zip(row, self._is_str)))

    def to_table(self) -> pa.Table:
        names = pa.array(self._names, pa.string())
        cols = {}
        for name, is_str, col in zip(self._fields, self._is_str, self._cols):
            values = np.array(col, dtype=np.dtype(col.typecode))  # a copy: appending stays possible
            cols[name] = pa.DictionaryArray.from_arrays(values, names).dictionary_decode() if is_str else values
        return pa.table(cols, schema=self.schema)


def to_table(records, schema: pa.Schema) -> pa.Table:
    """Column-wise build so an empty list still yields a typed, empty table."""
    if isinstance(records, RecordColumns):
        assert records.schema == schema, "record and schema disagree"
        return records.to_table()
    names = schema.names
    if records:
        assert [f.name for f in fields(records[0])] == names, "record and schema disagree"
    cols = {n: [getattr(r, n) for r in records] for n in names}
    return pa.table(cols, schema=schema)
