"""Connection reuse and its one retry, against the loopback test double (the thing under
test is our client): a keep-alive connection the server closed is never a failed request,
and nothing else is ever sent twice."""

import asyncio

from filledfirst.contracts.records import RequestRecord, ScheduledRequest
from filledfirst.loadgen.http1 import Pool, Target
from filledfirst.loadgen.stream import send_streamed

from helpers.stream_client import DONE, USAGE, replay_against, token
from helpers.stream_double import Answer, Request, StreamDouble

BODY = token() * 3 + USAGE + DONE
# "ok" answers in full (one write), "close" closes the connection without an answer,
# "headers" sends the status and headers and then closes, "die" stops listening and then closes.
ACTIONS = {"ok": Answer(pieces=[BODY]), "close": Answer(fault="close"), "headers": Answer(fault="headers"),
           "die": Answer(fault="die")}


def acting(action) -> StreamDouble:
    """A double that keeps connections open (keep-alive) and does what
    `action(n_on_connection, n_overall)` says with each completion request."""
    return StreamDouble(lambda req: ACTIONS[action(req.on_connection, req.n)])


def one_request_per_connection(on_conn: int, n: int) -> str:
    """Answers the first request of a connection, then closes it when the next arrives:
    the client's pooled connection is always already closed by the server."""
    return "ok" if on_conn == 0 else "close"


async def sequence(double: StreamDouble, n: int, gap_s: float = 0.0) -> list[RequestRecord]:
    """`n` requests one after the other on one keep-alive pool (a retry opens a fresh connection)."""
    recs = [RequestRecord(i, "probe", 5, 3, 0.0) for i in range(n)]
    loop = asyncio.get_running_loop()
    async with double.serving() as base, Pool(Target.parse(f"{base}/v1/completions"), connect_timeout_s=2) as pool:
        for rec in recs:
            await send_streamed(pool, b"{}", rec, [], loop.time, 5)
            await asyncio.sleep(gap_s)
    return recs


def test_closed_keepalive_connection_is_retried_once_on_a_fresh_one():
    double = acting(one_request_per_connection)
    recs = asyncio.run(sequence(double, 6))
    assert [r.status for r in recs] == ["ok"] * 6, [r.error for r in recs]
    assert all(r.output_tokens_received == 3 for r in recs)
    # Request 0 opens a connection that goes back to the pool; request 1 finds it closed and
    # is retried on a fresh, not pooled, connection; the pool is empty, so request 2 opens
    # a new one, and so on.
    assert [r.retries for r in recs] == [0, 1, 0, 1, 0, 1]
    assert double.requests == 9  # 6 answered + 3 that met a closed connection
    assert all(r.t_sent <= r.t_first_token <= r.t_done for r in recs)


def test_open_loop_replay_has_no_failed_rows_when_the_server_closes_idle_connections():
    double = acting(one_request_per_connection)
    sched = [ScheduledRequest(i, 0.01 * i, 5, 3, "x") for i in range(40)]
    replay = asyncio.run(replay_against(double, sched, request_timeout_s=5, drain_timeout_s=5))
    assert [r.status for r in replay.requests] == ["ok"] * 40, [r.error for r in replay.requests if r.error]
    retried = [r for r in replay.requests if r.retries]
    assert retried and all(r.retries == 1 for r in retried)
    # every request was answered exactly once; the extra reads are the closed-connection ones
    assert double.requests == 40 + len(retried)
    assert sorted(set(double.ids)) == sorted(f"ff-{i}" for i in range(40))


def test_death_after_headers_is_a_disconnect_and_not_retried():
    double = acting(lambda on_conn, n: "ok" if n == 0 else "headers")
    recs = asyncio.run(sequence(double, 2))
    assert recs[0].status == "ok"
    assert recs[1].status == "disconnected" and recs[1].http_status == 200 and recs[1].retries == 0
    assert double.requests == 2


def test_fresh_connection_closed_without_answer_is_not_retried():
    """Only a reused connection can be stale; a new one closed unanswered is the server's doing."""
    double = acting(lambda on_conn, n: "close")
    recs = asyncio.run(sequence(double, 1))
    assert recs[0].status == "disconnected" and recs[0].retries == 0
    assert double.requests == 1 and double.connections == 1


def test_server_that_died_still_fails_after_the_one_retry():
    """Stale connection, then the retry cannot connect: a failed row, sent to the server once."""
    double = acting(lambda on_conn, n: "ok" if n == 0 else "die")
    recs = asyncio.run(sequence(double, 2))
    assert recs[0].status == "ok"
    assert recs[1].status == "disconnected" and recs[1].retries == 1
    assert "could not connect" in recs[1].error
    assert double.requests == 2


def test_connection_refused_is_a_disconnect_without_retry():
    async def go():
        rec = RequestRecord(0, "probe", 5, 3, 0.0)
        async with Pool(Target.parse("http://127.0.0.1:9/v1/completions"), connect_timeout_s=2) as pool:
            await send_streamed(pool, b"{}", rec, [], lambda: 0.0, 2)
        return rec

    rec = asyncio.run(go())
    assert rec.status == "disconnected" and "could not connect to 127.0.0.1:9" in rec.error and rec.retries == 0


def test_slow_first_token_on_a_retried_request_still_times_out_from_the_first_send():
    """The first-token timeout spans both attempts: a retry does not restart it."""

    def slow(req: Request) -> Answer:
        if req.connection >= 1:  # the retry's connection answers too late
            return Answer(fault="close", first_delay=1.0)
        return ACTIONS[one_request_per_connection(req.on_connection, req.n)]

    double = StreamDouble(slow)

    async def go():
        recs = [RequestRecord(i, "probe", 5, 3, 0.0) for i in range(2)]
        loop = asyncio.get_running_loop()
        async with double.serving() as base, Pool(Target.parse(f"{base}/v1/completions"),
                                                  connect_timeout_s=2) as pool:
            for rec in recs:
                await send_streamed(pool, b"{}", rec, [], loop.time, 5, 0.3)
        return recs

    recs = asyncio.run(go())
    assert recs[0].status == "ok"
    assert recs[1].status == "timeout" and "first token within 0.3 s" in recs[1].error and recs[1].retries == 1
    assert recs[1].t_done - recs[1].t_sent < 0.9
