"""The streamed HTTP/1.1 exchange under the client (filledfirst.loadgen.http1), against raw
loopback servers that answer byte for byte as scripted: what the double cannot do (an
answer without framing, bytes that are not HTTP, a server that closes idle connections)."""

from __future__ import annotations

import asyncio

import pytest

from filledfirst.contracts.records import RequestRecord
from filledfirst.loadgen.http1 import Pool, Target
from filledfirst.loadgen.stream import send_streamed

from helpers.stream_client import DONE
from helpers.stream_double import StreamDouble, sse

TOKEN = sse({"choices": [{"index": 0, "text": "w"}], "usage": {"prompt_tokens": 5, "completion_tokens": 1}})
TOKENS: dict[int, list] = {}


async def raw_server(answer):
    """A server whose `answer(reader, writer, n)` handles connection number n; (url, connections)."""
    conns: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns.append(len(conns))
        try:
            await answer(reader, writer, conns[-1])
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/v1/completions", conns


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    return head + await reader.readexactly(length)


async def send(url: str, n: int = 1, pool: Pool | None = None, **kw) -> list[RequestRecord]:
    """`n` requests one after the other; each record's chunks are in TOKENS[its id]."""
    recs = []
    TOKENS.clear()
    loop = asyncio.get_running_loop()
    own = pool is None
    pool = pool or Pool(Target.parse(url), connect_timeout_s=2, **kw)
    try:
        for i in range(n):
            rec = RequestRecord(i, "probe", 5, 1, 0.0)
            TOKENS[i] = []
            await send_streamed(pool, b"{}", rec, TOKENS[i], loop.time, 5)
            recs.append(rec)
    finally:
        if own:
            pool.close()
    return recs


async def one_request(answer) -> list[RequestRecord]:
    """One request to a raw server answering with `answer`."""
    server, url, _ = await raw_server(answer)
    async with server:
        return await send(url)


def test_an_answer_that_runs_until_the_connection_closes():
    """No Content-Length, not chunked (HTTP/1.0 style): the body ends with the connection."""

    async def answer(reader, writer, n):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        for piece in (TOKEN, TOKEN, DONE):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.01)

    (rec,) = asyncio.run(one_request(answer))
    assert rec.status == "ok", rec.error
    assert rec.chunks == 2 and rec.output_tokens_received == 1


def test_bytes_that_are_not_http_are_an_http_error():
    async def answer(reader, writer, n):
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.2)

    (rec,) = asyncio.run(one_request(answer))
    assert rec.status == "http_error" and rec.error.startswith("invalid HTTP answer")


def test_events_of_one_read_share_one_timestamp_across_http_chunks():
    """Three HTTP chunks in one write: one read, so one instant (the analysis merges chunks
    read at one instant; a timestamp per HTTP chunk would make ITLs of microseconds)."""

    def framed(piece: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(piece), piece)

    async def answer(reader, writer, n):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(framed(TOKEN) + framed(TOKEN) + framed(TOKEN) + framed(DONE) + b"0\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.2)

    (rec,) = asyncio.run(one_request(answer))
    assert rec.status == "ok", rec.error
    assert len(TOKENS[0]) == 3 and len({t.t for t in TOKENS[0]}) == 1


def test_connections_are_reused_and_dropped_once_idle_too_long():
    async def go():
        double = StreamDouble(ttft_s=0.001, itl_s=0.001)
        async with double.serving() as base:
            url = f"{base}/v1/completions"
            async with Pool(Target.parse(url), connect_timeout_s=2, keepalive_s=0.2) as pool:
                a = await send(url, 3, pool)
                opened_back_to_back = pool.opened
                await asyncio.sleep(0.3)  # longer than keepalive_s
                b = await send(url, 1, pool)
                return a + b, opened_back_to_back, pool.opened, double.connections

    recs, back_to_back, opened, accepted = asyncio.run(go())
    assert [r.status for r in recs] == ["ok"] * 4 and not any(r.retries for r in recs)
    assert back_to_back == 1 and opened == 2 == accepted


def test_a_connection_the_server_closed_while_idle_is_not_used_again():
    """The server closes each connection a moment after answering (as uvicorn does after
    its keep-alive): the pool hears the close and opens a new one, no retry needed."""

    async def answer(reader, writer, n):
        await read_request(reader)
        body = TOKEN + DONE
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        await asyncio.sleep(0.05)

    async def go():
        server, url, conns = await raw_server(answer)
        async with server:
            pool = Pool(Target.parse(url), connect_timeout_s=2)
            recs = []
            for _ in range(3):
                recs += await send(url, 1, pool)
                await asyncio.sleep(0.15)
            pool.close()
            return recs, len(conns)

    recs, conns = asyncio.run(go())
    assert [r.status for r in recs] == ["ok"] * 3 and [r.retries for r in recs] == [0, 0, 0]
    assert conns == 3


def test_an_abandoned_answer_closes_its_connection():
    """A request cut by its timeout mid-stream: that connection never serves another."""

    async def go():
        double = StreamDouble(ttft_s=0.01, itl_s=0.05)
        async with double.serving() as base:
            pool = Pool(Target.parse(f"{base}/v1/completions"), connect_timeout_s=2)
            loop = asyncio.get_running_loop()
            rec = RequestRecord(0, "probe", 5, 100, 0.0)
            await send_streamed(pool, b'{"max_tokens": 100}', rec, [], loop.time, 0.2)
            after = await send(f"{base}/v1/completions", 1, pool)
            pool.close()
            return rec, after[0], pool.opened

    rec, after, opened = asyncio.run(go())
    assert rec.status == "timeout" and rec.chunks > 0
    assert after.status == "ok" and opened == 2


@pytest.mark.parametrize("url, host, port, path, header", [
    ("http://127.0.0.1:8000/v1/completions", "127.0.0.1", 8000, b"/v1/completions", b"127.0.0.1:8000"),
    ("https://api.example.com/v1/chat/completions?x=1", "api.example.com", 443, b"/v1/chat/completions?x=1",
     b"api.example.com"),
    ("http://[::1]:9/v1/completions", "::1", 9, b"/v1/completions", b"[::1]:9"),
])
def test_targets(url, host, port, path, header):
    t = Target.parse(url)
    assert (t.host, t.port, t.path, t.host_header) == (host, port, path, header)


def test_a_url_that_is_not_http_is_refused():
    with pytest.raises(ValueError, match="not an http"):
        Target.parse("ftp://example.com/x")
