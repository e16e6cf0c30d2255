"""Our SSE client against a loopback test double (the thing under test is the client)."""

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web

from filledfirst.loadgen.stream import send_streamed
from filledfirst.records import RequestRecord


def sse(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def token(text="w") -> bytes:
    return sse({"choices": [{"index": 0, "text": text}], "usage": None})


USAGE = sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}})
DONE = b"data: [DONE]\n\n"


async def run_against(pieces, *, status=200, delay=0.0, total_timeout=5.0):
    """Serve `pieces` (written one by one, so events split across reads) and record the request."""

    async def handler(request):
        if status != 200:
            return web.Response(status=status, text="overloaded")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for p in pieces:
            await resp.write(p)
            await asyncio.sleep(delay)
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    rec = RequestRecord(0, "probe", 5, 3, 0.0)
    tokens = []
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        async with aiohttp.ClientSession() as session:
            await send_streamed(
                session, f"http://127.0.0.1:{port}/v1/completions", b"{}", rec, tokens,
                lambda: loop.time() - t0, aiohttp.ClientTimeout(total=total_timeout),
            )
    finally:
        await runner.cleanup()
    return rec, tokens


def test_complete_stream_split_across_reads():
    body = token() + b": keep-alive\n\n" + token() + token() + USAGE + DONE
    pieces = [body[i : i + 7] for i in range(0, len(body), 7)]  # events cut mid-line
    rec, tokens = asyncio.run(run_against(pieces))
    assert rec.status == "ok", rec.error
    assert rec.chunks == 3 and [t.index for t in tokens] == [0, 1, 2]
    assert (rec.prompt_tokens_received, rec.output_tokens_received) == (5, 3)
    assert rec.t_sent <= rec.t_first_token <= rec.t_last_token <= rec.t_done


def test_several_events_in_one_read():
    rec, tokens = asyncio.run(run_against([token() + token() + USAGE + DONE]))
    assert rec.status == "ok" and len(tokens) == 2


def test_missing_done_is_a_disconnect():
    rec, _ = asyncio.run(run_against([token(), token()]))
    assert rec.status == "disconnected"
    assert "[DONE]" in rec.error


@pytest.mark.parametrize("status, expected", [(429, "rejected"), (503, "rejected"), (500, "http_error"), (400, "http_error")])
def test_http_errors_become_records(status, expected):
    rec, _ = asyncio.run(run_against([], status=status))
    assert rec.status == expected and rec.http_status == status and "overloaded" in rec.error


def test_invalid_json_and_error_events():
    rec, _ = asyncio.run(run_against([token(), b"data: {not json\n\n", DONE]))
    assert rec.status == "http_error" and "invalid JSON" in rec.error
    rec, _ = asyncio.run(run_against([sse({"error": {"message": "boom"}}), DONE]))
    assert rec.status == "http_error" and "boom" in rec.error


def test_slow_stream_times_out():
    rec, tokens = asyncio.run(run_against([token()] * 20, delay=0.1, total_timeout=0.5))
    assert rec.status == "timeout"
    assert 0 < len(tokens) < 20  # what arrived before the timeout is kept


def test_unreachable_server_is_a_disconnect():
    async def go():
        rec = RequestRecord(0, "probe", 5, 3, 0.0)
        async with aiohttp.ClientSession() as session:
            await send_streamed(session, "http://127.0.0.1:9/v1/completions", b"{}", rec, [], lambda: 0.0, aiohttp.ClientTimeout(total=2))
        return rec

    rec = asyncio.run(go())
    assert rec.status == "disconnected" and "Connect" in rec.error
