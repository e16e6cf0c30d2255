"""Every run has one deadline (filledfirst.deadline), the replay keeps it and the
cluster's time limit is budgeted from it. A closed loop cut at its deadline records every
request: the ones in flight as timeouts with the reason, the ones never sent as not_sent
with the reason."""

from __future__ import annotations

import asyncio

from filledfirst.contracts.records import ScheduledRequest
from filledfirst.deadline import run_deadline_s
from filledfirst.loadgen.replay import Replay
from filledfirst.loadgen.settings import ReplaySettings

from helpers.stream_client import scripted
from helpers.stream_double import StreamDouble

HUNG = scripted([b"data: [DONE]\n\n"], first_delay=3600)  # stream headers, then nothing for an hour


def settings(**kw) -> ReplaySettings:
    return ReplaySettings(**{"model": "m", "token_low": 10, "token_high": 20, "scrape_interval_s": 0.5, **kw})


def test_the_deadline_of_each_loop():
    assert run_deadline_s("open", 10, None, 30.0, 600, 120) == 150.0
    # 4 requests per worker (the concurrency sweep's), each at most the request timeout
    assert run_deadline_s("closed", 8, 2, 999.0, 600, 120) == 2400.0
    assert run_deadline_s("closed", 9, 2, 0.0, 600, 120) == 3000.0


def test_a_replay_takes_its_deadline_from_the_one_definition():
    sched = [ScheduledRequest(i, 0.5 * i, 5, 3, "x") for i in range(7)]
    closed = Replay(sched, "http://127.0.0.1:1", settings(mode="closed", concurrency=2, request_timeout_s=10))
    assert closed.deadline_s == run_deadline_s("closed", 7, 2, 3.0, 10, closed.settings.drain_timeout_s) == 40.0
    opened = Replay(sched, "http://127.0.0.1:1", settings(drain_timeout_s=5))
    assert opened.deadline_s == 8.0


def test_a_closed_loop_against_a_hung_server_ends_at_its_deadline_with_every_request_recorded():
    sched = [ScheduledRequest(i, 0.0, 5, 3, "x") for i in range(6)]
    double = StreamDouble(HUNG)

    async def go() -> Replay:
        async with double.serving() as base:
            replay = Replay(sched, base, settings(mode="closed", concurrency=2, request_timeout_s=60), progress=False)
            replay.deadline_s = 0.5  # sooner than any request's own timeout: the deadline ends it
            await replay.run()
        return replay

    replay = asyncio.run(go())
    statuses = sorted(r.status for r in replay.requests)
    assert statuses == ["not_sent"] * 4 + ["timeout"] * 2, [(r.status, r.error) for r in replay.requests]
    for r in replay.requests:
        assert "deadline" in r.error, r
        assert (r.t_done is not None) == (r.status == "timeout")
    assert double.requests == 2
    assert replay.interrupted is None
