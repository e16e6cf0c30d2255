"""Send one streamed completion and record what arrived, when; failures become records, never exceptions."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from typing import Annotated, Any, Callable

import aiohttp
import attr  # aiohttp's ClientTimeout is an attrs class
import msgspec

from filledfirst.metrics import PER_REQUEST, PER_REQUEST_METRICS
from filledfirst.records import RecordColumns, RequestRecord, TokenRecord

log = logging.getLogger(__name__)

_decode = msgspec.json.Decoder().decode  # several times faster than json.loads per chunk

# The fields we read, typed: decoding only them (unknown fields skipped, no dicts built)
# is the client's fast path per chunk. An event that does not fit falls back to the
# generic path below, which decides what it means, so the two cannot disagree.
_Count = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


class _Usage(msgspec.Struct):
    prompt_tokens: _Count | None = None
    completion_tokens: _Count | None = None


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
DRAIN_TIMEOUT = "drain timeout"  # the cancel message of requests still open when the drain ends
UNREADABLE = "the client could not read the answer"  # the error text of the last-resort catch
_ERROR_TEXT_MAX = 500


class SSEData:
    """Server-sent events to their `data:` payloads, whatever the byte boundaries.

    Comments (`: keep-alive`), blank separators and other fields are skipped. Lines end
    with LF, CRLF or a lone CR, as the SSE spec allows.
    """

    def __init__(self) -> None:
        self._partial = bytearray()  # an unfinished line, waiting for the next read

    def feed(self, chunk: bytes) -> list[bytes]:
        # A raw CR cannot occur inside a JSON payload, so every CR ends a line (a CRLF then
        # leaves an empty line behind, which is skipped like any blank separator).
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r", b"\n")
        end = chunk.rfind(b"\n")
        # Only the new bytes are searched and the unfinished line grows in place: joining
        # and re-splitting it at every read made a long line quadratic (0.8 s for 1 MiB
        # arriving in 1 KiB reads, 16 s for 4 MiB, found by tests/test_stream_fuzz.py),
        # all of it with the event loop, and so every other request's clock, stalled.
        if end < 0:
            self._partial += chunk
            return []
        self._partial += chunk[:end]
        lines = self._partial.split(b"\n")
        self._partial = bytearray(chunk[end + 1:])
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
    (found by tests/test_stream_fuzz.py), which in a replay left the request marked ok and
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
    if PER_REQUEST_METRICS in event:  # vLLM: on the final usage chunk only
        _server_timings(rec, event[PER_REQUEST_METRICS])
    return True


class _Attempt:
    """What aiohttp's tracing tells of one attempt's connection: reused from the pool (True),
    newly opened (False), or unknown (None: the session carries no `connection_trace()`)."""

    __slots__ = ("reused",)

    def __init__(self) -> None:
        self.reused: bool | None = None


def connection_trace() -> aiohttp.TraceConfig:
    """Give this to the keep-alive session so only requests on a reused connection are retried."""

    async def created(session, ctx, params) -> None:
        if isinstance(ctx.trace_request_ctx, _Attempt):
            ctx.trace_request_ctx.reused = False

    async def reused(session, ctx, params) -> None:
        if isinstance(ctx.trace_request_ctx, _Attempt):
            ctx.trace_request_ctx.reused = True

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(created)
    trace.on_connection_reuseconn.append(reused)
    return trace


# What a pooled connection that the server closed while idle fails with: the server's FIN
# read before any answer, or the request's write hitting the closed socket. Not a connect
# failure (ClientConnectorError is a ClientOSError too) and not a timeout.
_STALE_ERRORS = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientConnectionResetError)


def _stale_connection(exc: BaseException, rec: RequestRecord, attempt: _Attempt) -> bool:
    return (
        isinstance(exc, _STALE_ERRORS)
        and not isinstance(exc, aiohttp.ClientConnectorError)
        and rec.http_status is None
        and rec.chunks == 0  # nothing streamed yet (a first token comes with a chunk)
        and attempt.reused is not False  # a fresh connection that failed is the server's doing
    )


async def send_streamed(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    rec: RequestRecord,
    tokens: RecordColumns | list[TokenRecord],
    clock: Callable[[], float],
    timeout: aiohttp.ClientTimeout,
    first_token_timeout_s: float | None = None,
    fresh_session: aiohttp.ClientSession | None = None,
) -> None:
    """`timeout.total` bounds the whole request, `timeout.sock_connect` the connection, and
    `first_token_timeout_s` the wait for the first streamed token (queueing included).

    With `fresh_session` (a session that opens a new connection per request), a request
    whose pooled keep-alive connection turns out to be closed by the server before any
    answer is sent once more on a fresh connection: a race of connection reuse, not a
    failure of the server. At most one retry (`rec.retries`); `t_sent` stays the first
    attempt's, and both timeouts count from it."""
    rec.t_sent = clock()
    # Lifted at the first token; the total timeout still bounds the rest.
    first_token = asyncio.timeout(first_token_timeout_s)
    try:
        async with first_token:
            attempt_session, attempt_timeout = session, timeout
            while True:
                attempt = _Attempt()
                try:
                    await _exchange(attempt_session, url, body, rec, tokens, clock, attempt_timeout, first_token,
                                    attempt)
                    break
                except aiohttp.ClientError as exc:
                    if fresh_session is None or rec.retries or not _stale_connection(exc, rec, attempt):
                        raise
                rec.retries += 1
                attempt_session = fresh_session
                if timeout.total is not None:  # the total still counts from the first send
                    left = max(timeout.total - (clock() - rec.t_sent), 1e-3)
                    attempt_timeout = attr.evolve(timeout, total=left)
    except aiohttp.ConnectionTimeoutError:
        rec.status, rec.error = "timeout", f"could not connect within {timeout.sock_connect} s"
    except asyncio.TimeoutError:
        rec.status = "timeout"
        if first_token.expired() and rec.t_first_token is None:
            rec.error = f"no first token within {first_token_timeout_s} s"
        else:
            rec.error = f"no complete answer within {timeout.total} s"
    except aiohttp.ClientError as exc:
        rec.status, rec.error = "disconnected", f"{type(exc).__name__}: {exc}"[:_ERROR_TEXT_MAX]
    except Exception as exc:
        # An answer no check above foresaw (or a bug of ours) still ends as a failed record
        # rather than an exception: raised, it would leave the request marked ok in an open
        # loop and end its worker in a closed one. The fuzz tests assert this never fires.
        log.exception("request %s: %s", rec.request_id, UNREADABLE)
        rec.status, rec.error = "http_error", f"{UNREADABLE}: {type(exc).__name__}: {exc}"[:_ERROR_TEXT_MAX]
    except asyncio.CancelledError as exc:
        why = exc.args[0] if exc.args else "run interrupted"
        rec.status = "timeout" if why == DRAIN_TIMEOUT else "disconnected"
        rec.error = f"{why} while the request was in flight"
        raise
    finally:
        rec.t_done = clock()


async def _exchange(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    rec: RequestRecord,
    tokens: RecordColumns | list[TokenRecord],
    clock: Callable[[], float],
    timeout: aiohttp.ClientTimeout,
    first_token: asyncio.Timeout,
    attempt: _Attempt,
) -> None:
    """One attempt: send, read the stream into `rec` and `tokens`; transport errors raise."""
    done = False
    async with session.post(
        url, data=body, timeout=timeout, trace_request_ctx=attempt,
        # The id lets a server's own logs (vLLM uses it) be matched to our rows.
        headers={"Content-Type": "application/json", "X-Request-Id": f"ff-{rec.request_id}"},
    ) as resp:
        rec.http_status = resp.status
        if resp.status != 200:
            rec.status = "rejected" if resp.status in _REJECT_STATUSES else "http_error"
            # errors="replace": an error body that is not valid UTF-8 raised UnicodeDecodeError
            # out of the client (found by tests/test_stream_fuzz.py). An empty one says nothing.
            text = (await resp.text(errors="replace"))[:_ERROR_TEXT_MAX]
            rec.error = text if text.strip() else f"HTTP {resp.status}"
            return
        # Whatever arrived in one read shares one timestamp; events split across reads
        # are joined by the parser. Fewer awaits than line-by-line reading.
        parser = SSEData()
        async for raw in resp.content.iter_any():
            t = clock()
            for data in parser.feed(raw):
                if data == b"[DONE]":
                    done = True
                    break
                if not _take_event(rec, tokens, t, data, first_token):
                    return
            if done:
                break
        if not done:
            rec.status, rec.error = "disconnected", "stream ended without [DONE]"
