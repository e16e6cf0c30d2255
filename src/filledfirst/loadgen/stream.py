"""Send one streamed completion and record what arrived, when; failures become records, never exceptions."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from typing import Annotated, Any, Callable

import msgspec

from filledfirst.contracts.records import RecordColumns, RequestRecord, TokenRecord
from filledfirst.engines.vllm import PER_REQUEST, PER_REQUEST_METRICS
from filledfirst.loadgen.fdlimit import out_of_files_error
from filledfirst.loadgen.http1 import ConnectTimeout, Disconnected, HTTPFailure, InvalidAnswer, OutOfFiles, Pool

log = logging.getLogger(__name__)

_decode = msgspec.json.Decoder().decode  # several times faster than json.loads per chunk

# The fields we read, typed: decoding only them (unknown fields skipped, no dicts built)
# is the client's fast path per chunk. An event that does not fit falls back to the
# generic path below, which decides what it means, so the two cannot disagree.
_Count = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


class _PromptDetails(msgspec.Struct):
    cached_tokens: _Count | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: _Count | None = None
    completion_tokens: _Count | None = None
    prompt_tokens_details: _PromptDetails | None = None


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class _Choice(msgspec.Struct):
    text: str | None = None
    delta: _Delta | None = None


class _Event(msgspec.Struct):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    metrics: Any = msgspec.UNSET  # PER_REQUEST_METRICS, any shape: _server_timings judges it
    error: Any = msgspec.UNSET


assert PER_REQUEST_METRICS == "metrics", "the typed event names vLLM's field"
_decode_event = msgspec.json.Decoder(_Event).decode

_REJECT_STATUSES = {429, 503}
# The cancel message of requests still open at the run's deadline (filledfirst.deadline).
DEADLINE_PASSED = "the run's deadline passed"
UNREADABLE = "the client could not read the answer"  # the error text of the last-resort catch
_ERROR_TEXT_MAX = 500
# The longest SSE line the client holds. Far above any real event: vLLM's final usage chunk
# with its per-request metrics is under 2 KiB, a chunk of text tens of KiB at most. Without
# a cap, a server that never sends a newline grows the client's memory until the request
# timeout, and an out-of-memory kill loses the whole run.
MAX_LINE_BYTES = 1 << 20


class LineTooLong(InvalidAnswer):
    """A line of the stream longer than MAX_LINE_BYTES: not an answer we can read. The
    request is an `http_error` (the server's answer is invalid, as with bytes that are not
    HTTP), and the connection is dropped with it."""

    def __init__(self) -> None:
        super().__init__(f"a line of the event stream longer than {MAX_LINE_BYTES:,} bytes "
                         "(no server-sent event is that long): answer dropped")


class SSEData:
    """Server-sent events to their `data:` payloads, whatever the byte boundaries.

    Comments (`: keep-alive`), blank separators and other fields are skipped. Lines end
    with LF, CRLF or a lone CR, as the SSE spec allows. A line longer than MAX_LINE_BYTES
    raises LineTooLong.
    """

    def __init__(self) -> None:
        self._partial = bytearray()  # an unfinished line, waiting for the next read

    def feed(self, chunk: bytes) -> list[bytes]:
        # Nearly every read is one whole event (`data: {...}` and its blank line: servers
        # write an event per HTTP chunk), nothing pending: its payload, without building
        # lines. Anything else takes the general path; both give the same payloads
        # (tests/loadgen/test_stream_fuzz.py).
        if (not self._partial and chunk.startswith(b"data:") and chunk.endswith(b"\n\n")
                and chunk.count(b"\n") == 2 and b"\r" not in chunk and len(chunk) <= MAX_LINE_BYTES):
            return [chunk[5:-2].strip()]
        return self._lines(chunk)

    def _lines(self, chunk: bytes) -> list[bytes]:
        # A raw CR cannot occur inside a JSON payload, so every CR ends a line (a CRLF then
        # leaves an empty line behind, which is skipped like any blank separator).
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r", b"\n")
        end = chunk.rfind(b"\n")
        # Only the new bytes are searched and the unfinished line grows in place: joining
        # and re-splitting it at every read made a long line quadratic (0.8 s for 1 MiB
        # arriving in 1 KiB reads, 16 s for 4 MiB, found by tests/loadgen/test_stream_fuzz.py),
        # all of it with the event loop, and so every other request's clock, stalled.
        if end < 0:
            if len(self._partial) + len(chunk) > MAX_LINE_BYTES:
                raise LineTooLong()
            self._partial += chunk
            return []
        self._partial += chunk[:end]
        lines = self._partial.split(b"\n")
        self._partial = bytearray(chunk[end + 1:])
        if len(self._partial) > MAX_LINE_BYTES or any(len(line) > MAX_LINE_BYTES for line in lines):
            raise LineTooLong()
        out = []
        for line in lines:
            line = line.strip()
            if line.startswith(b"data:"):
                out.append(bytes(line[5:].strip()))
        return out


def _count(value: object) -> bool:
    """A token count as the records store it: absent, or a JSON integer that fits int64."""
    return value is None or (type(value) is int and 0 <= value < 2**63)


def _well_formed(event: dict) -> bool:
    """The fields we read have the types we read them as. A server that sends
    `"usage": [1]`, `"choices": "abc"` or `"completion_tokens": "3"` made the client raise
    (found by tests/loadgen/test_stream_fuzz.py), which in a replay left the request marked ok and
    ended a closed-loop worker; a count of "x" or 2**70 was stored as is and failed the
    Parquet write of the whole run, and 3.5 was silently stored as 3."""
    usage, choices = event.get("usage"), event.get("choices")
    if usage is not None and not (
        isinstance(usage, dict) and _count(usage.get("prompt_tokens")) and _count(usage.get("completion_tokens"))
    ):
        return False
    return choices is None or (isinstance(choices, list) and all(isinstance(c, dict) for c in choices))


def _reasoning_text(choice: dict) -> str | None:
    """Reasoning deltas of a chat chunk: vLLM's older `reasoning_content` or newer `reasoning`."""
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return None
    return delta.get("reasoning_content") or delta.get("reasoning")


def _text(choice: dict) -> str | None:
    delta = choice.get("delta")
    return delta.get("content") if isinstance(delta, dict) else choice.get("text")


def _duration_ms(value: object) -> float | None:
    """A JSON number that can be a duration; None for anything else (a bool, a string, an
    integer too large for a float, a negative one)."""
    if type(value) not in (int, float):
        return None
    try:
        x = float(value)  # type: ignore[arg-type]
    except OverflowError:
        return None
    return x if math.isfinite(x) and x >= 0 else None


def _server_timings(rec: RequestRecord, metrics: object) -> None:
    """vLLM's per-request timings (`metrics` of the final usage chunk) onto the record. A
    value that is not a duration stays None rather than failing the request: the answer
    itself arrived whole, and these only explain where its time went."""
    if not isinstance(metrics, dict):
        return
    for ours, theirs in PER_REQUEST.items():
        setattr(rec, ours, _duration_ms(metrics.get(theirs)))


def _count_chunk(
    rec: RequestRecord, tokens: RecordColumns | list[TokenRecord], t: float, reasoning: object, text: object,
    so_far: int | None, first_token: asyncio.Timeout,
) -> None:
    """One streamed choice chunk (its reasoning and text deltas, and the usage's
    completion_tokens so far): how many tokens it carried, and of which kind."""
    if so_far is not None:
        n = so_far - (rec.output_tokens_received or 0)
    else:
        # Other servers give no per-chunk usage: a chunk with text counts as one token,
        # and chat's opening role-only chunk (no text) as none.
        n = 1 if (reasoning or text) else 0
    tokens.append(TokenRecord(rec.request_id, rec.chunks, t, n))
    rec.chunks += 1
    if n <= 0:
        return
    if rec.t_first_token is None:
        rec.t_first_token = t
        first_token.reschedule(None)
    rec.t_last_token = t
    if reasoning:
        rec.reasoning_tokens += n
    elif rec.t_first_content is None:
        rec.t_first_content = t


def _take_event(rec: RequestRecord, tokens: RecordColumns | list[TokenRecord], t: float, data: bytes,
                first_token: asyncio.Timeout) -> bool:
    """One `data:` payload onto the record; False when it ended the request (an error
    event, or one we cannot read)."""
    try:
        event = _decode_event(data)
    except msgspec.ValidationError:
        return _take_any_event(rec, tokens, t, data, first_token)
    except (ValueError, msgspec.DecodeError):
        rec.status, rec.error = "http_error", f"invalid JSON in stream: {data[:200]!r}"
        return False
    usage = event.usage
    if event.error is not msgspec.UNSET or (
            usage is not None and usage.prompt_tokens is None and usage.completion_tokens is None):
        return _take_any_event(rec, tokens, t, data, first_token)  # what such an event means is decided there
    if event.choices:
        choice = event.choices[0]
        delta = choice.delta
        reasoning = (delta.reasoning_content or delta.reasoning) if delta is not None else None
        text = delta.content if delta is not None else choice.text
        _count_chunk(rec, tokens, t, reasoning, text, usage.completion_tokens if usage is not None else None,
                     first_token)
    if usage is not None:
        rec.prompt_tokens_received = usage.prompt_tokens
        rec.output_tokens_received = usage.completion_tokens
        if usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens is not None:
            rec.cached_tokens = usage.prompt_tokens_details.cached_tokens
    if event.metrics is not msgspec.UNSET:  # vLLM: on the final usage chunk only
        _server_timings(rec, event.metrics)
    return True


def _take_any_event(rec: RequestRecord, tokens: RecordColumns | list[TokenRecord], t: float, data: bytes,
                    first_token: asyncio.Timeout) -> bool:
    """The generic path: any JSON, checked field by field."""
    try:
        event = _decode(data)
    except (ValueError, msgspec.DecodeError):
        rec.status, rec.error = "http_error", f"invalid JSON in stream: {data[:200]!r}"
        return False
    if isinstance(event, dict) and "error" in event:
        rec.status, rec.error = "http_error", json.dumps(event["error"])[:_ERROR_TEXT_MAX]
        return False
    if not isinstance(event, dict) or not _well_formed(event):
        rec.status, rec.error = "http_error", f"unexpected event in stream: {data[:200]!r}"
        return False
    usage = event.get("usage")
    choices = event.get("choices")
    if choices:
        choice = choices[0]
        _count_chunk(rec, tokens, t, _reasoning_text(choice), _text(choice),
                     usage.get("completion_tokens") if usage else None, first_token)
    if usage:
        rec.prompt_tokens_received = usage.get("prompt_tokens")
        rec.output_tokens_received = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details")
        # a malformed detail is not worth failing a request over: its count stays unknown
        if isinstance(details, dict) and details.get("cached_tokens") is not None and _count(details["cached_tokens"]):
            rec.cached_tokens = details["cached_tokens"]
    if PER_REQUEST_METRICS in event:  # vLLM: on the final usage chunk only
        _server_timings(rec, event[PER_REQUEST_METRICS])
    return True


class _Answer:
    """One attempt's answer onto its record, read by http1 as it arrives (an `http1.Sink`)."""

    __slots__ = ("rec", "tokens", "first_token", "parser", "done", "stopped", "error_body")

    def __init__(self, rec: RequestRecord, tokens: RecordColumns | list[TokenRecord], first_token: asyncio.Timeout):
        self.rec, self.tokens, self.first_token = rec, tokens, first_token
        self.parser = SSEData()
        self.done = self.stopped = False  # [DONE] seen; an event ended the request
        self.error_body: bytearray | None = None  # the body of an answer other than 200

    def status(self, code: int) -> None:
        self.rec.http_status = code
        if code != 200:
            self.rec.status = "rejected" if code in _REJECT_STATUSES else "http_error"
            self.error_body = bytearray()

    def body(self, t: float, data: bytes) -> bool:
        if self.error_body is not None:
            if len(self.error_body) < 4 * _ERROR_TEXT_MAX:  # enough bytes for the characters kept
                self.error_body += data
            return True
        for event in self.parser.feed(data):
            if event == b"[DONE]":
                self.done = True
                return False
            if not _take_event(self.rec, self.tokens, t, event, self.first_token):
                self.stopped = True
                return False
        return True

    def end(self) -> None:
        rec = self.rec
        if self.error_body is not None:
            # errors="replace": an error body that is not valid UTF-8 raised UnicodeDecodeError
            # out of the client (found by tests/loadgen/test_stream_fuzz.py). An empty one says nothing.
            text = self.error_body.decode(errors="replace")[:_ERROR_TEXT_MAX]
            rec.error = text if text.strip() else f"HTTP {rec.http_status}"
        elif not (self.done or self.stopped):
            rec.status, rec.error = "disconnected", "stream ended without [DONE]"


async def send_streamed(
    pool: Pool,
    body: bytes,
    rec: RequestRecord,
    tokens: RecordColumns | list[TokenRecord],
    clock: Callable[[], float],
    total_timeout_s: float | None,
    first_token_timeout_s: float | None = None,
    *,
    retry: bool = True,
) -> None:
    """`total_timeout_s` bounds the whole request, the pool's connect timeout the
    connection, and `first_token_timeout_s` the wait for the first streamed token
    (queueing included).

    With `retry`, a request whose pooled keep-alive connection turns out to be closed by
    the server before any answer is sent once more on a fresh connection: a race of
    connection reuse, not a failure of the server. At most one retry (`rec.retries`);
    `t_sent` stays the first attempt's, and both timeouts count from it."""
    rec.t_sent = clock()
    # The id lets a server's own logs (vLLM uses it) be matched to our rows.
    headers = {"X-Request-Id": f"ff-{rec.request_id}"}
    # Lifted at the first token; the total timeout still bounds the rest.
    first_token = asyncio.timeout(first_token_timeout_s)
    try:
        async with asyncio.timeout(total_timeout_s), first_token:
            fresh = False
            while True:
                try:
                    await pool.exchange(body, headers, _Answer(rec, tokens, first_token), clock, fresh=fresh)
                    break
                except Disconnected as exc:
                    if not retry or fresh or exc.answered or not exc.reused:
                        raise
                rec.retries += 1
                fresh = True
    except OutOfFiles as exc:
        # Never sent: the server is not to blame (filledfirst.loadgen.fdlimit).
        rec.status, rec.error, rec.t_sent = "not_sent", out_of_files_error(exc.os_error), None
    except ConnectTimeout as exc:
        rec.status, rec.error = "timeout", str(exc)
    except TimeoutError:
        rec.status = "timeout"
        if first_token.expired() and rec.t_first_token is None:
            rec.error = f"no first token within {first_token_timeout_s} s"
        else:
            rec.error = f"no complete answer within {total_timeout_s} s"
    except InvalidAnswer as exc:
        rec.status, rec.error = "http_error", str(exc)[:_ERROR_TEXT_MAX]
    except HTTPFailure as exc:
        rec.status, rec.error = "disconnected", str(exc)[:_ERROR_TEXT_MAX]
    except Exception as exc:
        # An answer no check above foresaw (or a bug of ours) still ends as a failed record
        # rather than an exception: raised, it would leave the request marked ok in an open
        # loop and end its worker in a closed one. The fuzz tests assert this never fires.
        log.exception("request %s: %s", rec.request_id, UNREADABLE)
        rec.status, rec.error = "http_error", f"{UNREADABLE}: {type(exc).__name__}: {exc}"[:_ERROR_TEXT_MAX]
    except asyncio.CancelledError as exc:
        why = exc.args[0] if exc.args else "run interrupted"
        rec.status = "timeout" if why == DEADLINE_PASSED else "disconnected"
        rec.error = f"{why} while the request was in flight"
        raise
    finally:
        rec.t_done = clock() if rec.t_sent is not None else None
