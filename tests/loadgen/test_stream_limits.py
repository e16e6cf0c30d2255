"""What one answer may make the client hold: an SSE line, an answer's headers.

A server that never ends a line (or its headers) must not grow the client's memory until
the request timeout: past the cap the request fails as `http_error` with the reason, and
the connection is dropped; a line just under the cap is read as any other."""

from __future__ import annotations

import asyncio

import pytest

from filledfirst.contracts.records import RequestRecord
from filledfirst.loadgen.http1 import MAX_HEAD_BYTES, InvalidAnswer, Pool, Target
from filledfirst.loadgen.stream import MAX_LINE_BYTES, SSEData, send_streamed

from helpers.stream_client import DONE, USAGE, run_against, token

KIB = 1024


def test_a_line_longer_than_the_cap_fails_the_request_and_drops_the_connection():
    # Never a newline: 1 KiB after 1 KiB, for far longer than the cap.
    pieces = [b"data: {\"choices\": [{\"text\": \""] + [b"y" * KIB] * (MAX_LINE_BYTES // KIB + 64)
    rec, tokens = asyncio.run(run_against(pieces, total_timeout=60))
    assert rec.status == "http_error", rec
    assert f"longer than {MAX_LINE_BYTES:,} bytes" in rec.error and not tokens


def test_one_read_with_a_whole_line_over_the_cap_fails_too():
    with pytest.raises(InvalidAnswer, match="longer than"):
        SSEData().feed(b"data: " + b"y" * MAX_LINE_BYTES + b"\n\n")


def test_a_line_just_under_the_cap_parses_and_grows_in_place():
    """Joining and re-splitting the unfinished line at every read made a long line
    quadratic (16 s for 4 MiB in 1 KiB reads): it grows in place, one buffer."""
    parser = SSEData()
    head = b"data: "
    parser.feed(head)
    buffer = parser._partial
    body = MAX_LINE_BYTES - len(head) - 1
    for _ in range(body // KIB):
        assert parser.feed(b"y" * KIB) == []
        assert parser._partial is buffer  # extended, never copied
    assert parser.feed(b"y" * (body % KIB) + b"\ndata: [DONE]\n") == [b"y" * body, b"[DONE]"]


def test_a_stream_with_lines_under_the_cap_is_ok():
    big = token("z" * (256 * KIB))
    rec, tokens = asyncio.run(run_against([big[i:i + 4096] for i in range(0, len(big), 4096)] + [USAGE, DONE]))
    assert rec.status == "ok", rec.error
    assert len(tokens) == 1


def test_endless_headers_fail_the_request():
    """An answer whose headers never end: httptools keeps the unfinished header value."""

    async def go():
        async def serve(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nX-Long: ")
            try:
                for _ in range(MAX_HEAD_BYTES // KIB + 64):
                    writer.write(b"a" * KIB)
                    await writer.drain()
                await asyncio.sleep(30)
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        rec = RequestRecord(0, "probe", 5, 3, 0.0)
        async with Pool(Target.parse(f"http://127.0.0.1:{port}/v1/completions"), connect_timeout_s=5) as pool:
            await send_streamed(pool, b"{}", rec, [], asyncio.get_running_loop().time, 30)
        server.close()
        return rec

    rec = asyncio.run(go())
    assert rec.status == "http_error", rec
    assert f"headers longer than {MAX_HEAD_BYTES:,} bytes" in rec.error
