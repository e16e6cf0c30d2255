"""Send one streamed completion and record what arrived, when; failures become records, never exceptions."""

from __future__ import annotations

import asyncio
import json
from typing import Callable

import aiohttp
import attr  # aiohttp's ClientTimeout is an attrs class
import msgspec

from filledfirst.records import RequestRecord, TokenRecord

_decode = msgspec.json.Decoder().decode  # several times faster than json.loads per chunk

_REJECT_STATUSES = {429, 503}
DRAIN_TIMEOUT = "drain timeout"  # the cancel message of requests still open when the drain ends
_ERROR_TEXT_MAX = 500


class SSEData:
    """Server-sent events to their `data:` payloads, whatever the byte boundaries.

    Comments (`: keep-alive`), blank separators and other fields are skipped.
    """

    def __init__(self) -> None:
        self._partial = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()  # an unfinished line waits for the next read
        out = []
        for line in lines:
            line = line.strip()
            if line.startswith(b"data:"):
                out.append(line[5:].strip())
        return out


def _reasoning_text(choice: dict) -> str | None:
    """Reasoning deltas of a chat chunk: vLLM's older `reasoning_content` or newer `reasoning`."""
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return None
    return delta.get("reasoning_content") or delta.get("reasoning")


def _text(choice: dict) -> str | None:
    delta = choice.get("delta")
    return delta.get("content") if isinstance(delta, dict) else choice.get("text")


def _count_chunk(
    rec: RequestRecord, tokens: list[TokenRecord], t: float, choice: dict, usage: dict | None,
    first_token: asyncio.Timeout,
) -> None:
    """One streamed choice chunk: how many tokens it carried, and of which kind."""
    reasoning = _reasoning_text(choice)
    so_far = usage.get("completion_tokens") if usage else None
    if so_far is not None:
        n = so_far - (rec.output_tokens_received or 0)
    else:
        # Other servers give no per-chunk usage: a chunk with text counts as one token,
        # and chat's opening role-only chunk (no text) as none.
        n = 1 if (reasoning or _text(choice)) else 0
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
    tokens: list[TokenRecord],
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
                    await _exchange(attempt_session, url, body, rec, tokens, clock, attempt_timeout, first_token, attempt)
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
    tokens: list[TokenRecord],
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
            rec.error = (await resp.text())[:_ERROR_TEXT_MAX]
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
                try:
                    event = _decode(data)
                except (ValueError, msgspec.DecodeError):
                    rec.status, rec.error = "http_error", f"invalid JSON in stream: {data[:200]!r}"
                    return
                if not isinstance(event, dict):
                    rec.status, rec.error = "http_error", f"unexpected event in stream: {data[:200]!r}"
                    return
                if "error" in event:
                    rec.status, rec.error = "http_error", json.dumps(event["error"])[:_ERROR_TEXT_MAX]
                    return
                usage = event.get("usage")
                choices = event.get("choices")
                if choices:
                    _count_chunk(rec, tokens, t, choices[0], usage, first_token)
                if usage:
                    rec.prompt_tokens_received = usage.get("prompt_tokens")
                    rec.output_tokens_received = usage.get("completion_tokens")
            if done:
                break
        if not done:
            rec.status, rec.error = "disconnected", "stream ended without [DONE]"
