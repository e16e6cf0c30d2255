"""Our client driven against the loopback double (helpers/stream_double.py): the stream
pieces a test scripts (tokens, the usage chunk, [DONE]), one request sent through the
client's pool against a scripted answer, and a whole replay against a double."""

from __future__ import annotations

import asyncio

from filledfirst.contracts.records import RequestRecord
from filledfirst.loadgen.http1 import Pool, Target
from filledfirst.loadgen.replay import Replay
from filledfirst.loadgen.settings import ReplaySettings
from filledfirst.loadgen.stream import send_streamed

from helpers.stream_double import Answer, StreamDouble, sse


def token(text="w") -> bytes:
    return sse({"choices": [{"index": 0, "text": text}], "usage": None})


USAGE = sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}})
DONE = b"data: [DONE]\n\n"


def scripted(pieces, *, status=200, error_body=b"overloaded", delay=0.0, first_delay=0.0) -> Answer:
    """`status` and `error_body`, or 200 and the `pieces` of a stream written one by one
    (so events split across reads), `first_delay` before the first and `delay` after each."""
    return Answer(status=status, body=error_body if error_body is not None else b"", pieces=list(pieces),
                  first_delay=first_delay, delay=delay)


async def run_against(pieces, *, status=200, delay=0.0, total_timeout=5.0, first_delay=0.0, first_token_timeout=None,
                      error_body=b"overloaded"):
    """Serve `pieces` (see `scripted`) and record the request."""
    double = StreamDouble(scripted(pieces, status=status, error_body=error_body, delay=delay,
                                   first_delay=first_delay))
    rec = RequestRecord(0, "probe", 5, 3, 0.0)
    tokens = []
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    async with double.serving() as base, Pool(Target.parse(f"{base}/v1/completions"), connect_timeout_s=2) as pool:
        await send_streamed(pool, b"{}", rec, tokens, lambda: loop.time() - t0, total_timeout, first_token_timeout)
    return rec, tokens


async def replay_against(double: StreamDouble, schedule, **settings) -> Replay:
    """Replay `schedule` against `double`; `settings` on top of ReplaySettings' defaults."""
    settings = ReplaySettings(**{"model": "m", "token_low": 10, "token_high": 20, "scrape_interval_s": 0.5, **settings})
    async with double.serving() as base:
        replay = Replay(schedule, base, settings, progress=False)
        await replay.run()
    return replay
