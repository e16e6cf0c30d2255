"""Send one streamed completion and record what arrived, when; failures become records, never exceptions."""

from __future__ import annotations

import asyncio
import json
from typing import Callable

import aiohttp

from filledfirst.records import RequestRecord, TokenRecord

_REJECT_STATUSES = {429, 503}
DRAIN_TIMEOUT = "drain timeout"  # the cancel message of requests still open when the drain ends
_ERROR_TEXT_MAX = 500


async def send_streamed(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    rec: RequestRecord,
    tokens: list[TokenRecord],
    clock: Callable[[], float],
    timeout: aiohttp.ClientTimeout,
) -> None:
    rec.t_sent = clock()
    done = False
    try:
        async with session.post(
            url, data=body, headers={"Content-Type": "application/json"}, timeout=timeout
        ) as resp:
            rec.http_status = resp.status
            if resp.status != 200:
                rec.status = "rejected" if resp.status in _REJECT_STATUSES else "http_error"
                rec.error = (await resp.text())[:_ERROR_TEXT_MAX]
                return
            # aiohttp's StreamReader yields whole lines however the bytes were split.
            async for raw in resp.content:
                t = clock()
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue  # SSE comments/keep-alives and blank separators
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                try:
                    event = json.loads(data)
                except ValueError:
                    rec.status, rec.error = "http_error", f"invalid JSON in stream: {data[:200]!r}"
                    return
                if "error" in event:
                    rec.status, rec.error = "http_error", json.dumps(event["error"])[:_ERROR_TEXT_MAX]
                    return
                usage = event.get("usage")
                if event.get("choices"):
                    if rec.t_first_token is None:
                        rec.t_first_token = t
                    rec.t_last_token = t
                    # Without per-chunk usage (other servers) a chunk counts as one token.
                    so_far = usage.get("completion_tokens") if usage else None
                    n = so_far - (rec.output_tokens_received or 0) if so_far is not None else 1
                    tokens.append(TokenRecord(rec.request_id, rec.chunks, t, n))
                    rec.chunks += 1
                if usage:
                    rec.prompt_tokens_received = usage.get("prompt_tokens")
                    rec.output_tokens_received = usage.get("completion_tokens")
            if not done:
                rec.status, rec.error = "disconnected", "stream ended without [DONE]"
    except asyncio.TimeoutError:
        rec.status, rec.error = "timeout", f"no complete answer within {timeout.total} s"
    except aiohttp.ClientError as exc:
        rec.status, rec.error = "disconnected", f"{type(exc).__name__}: {exc}"[:_ERROR_TEXT_MAX]
    except asyncio.CancelledError as exc:
        why = exc.args[0] if exc.args else "run interrupted"
        rec.status = "timeout" if why == DRAIN_TIMEOUT else "disconnected"
        rec.error = f"{why} while the request was in flight"
        raise
    finally:
        rec.t_done = clock()
