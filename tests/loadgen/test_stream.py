"""Our SSE client against the loopback test double (the thing under test is the client)."""

import asyncio
import json

import pytest

from filledfirst.contracts.records import ScheduledRequest

from helpers.stream_client import DONE, USAGE, replay_against, run_against, scripted, token
from helpers.stream_double import StreamDouble, sse


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


@pytest.mark.parametrize("status, expected",
                         [(429, "rejected"), (503, "rejected"), (500, "http_error"), (400, "http_error")])
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


def test_first_token_timeout():
    rec, tokens = asyncio.run(run_against([token(), USAGE, DONE], first_delay=1.0, first_token_timeout=0.3))
    assert rec.status == "timeout" and "first token within 0.3 s" in rec.error and not tokens
    # once the first token is in, only the total timeout applies
    rec, tokens = asyncio.run(run_against([token()] * 5 + [USAGE, DONE], delay=0.1, first_token_timeout=0.3))
    assert rec.status == "ok", rec.error
    assert len(tokens) == 5


def test_closed_loop_workers_against_a_test_double():
    """N workers: never more than N in flight, every request sent once, in order per worker."""
    double = StreamDouble(ttft_s=0.01, itl_s=0.01)  # 3 tokens 10 ms apart, usage on each
    sched = [ScheduledRequest(i, 999.0, 5, 3, "x") for i in range(15)]  # arrival times ignored
    replay = asyncio.run(replay_against(double, sched, request_timeout_s=5, drain_timeout_s=5, mode="closed",
                                        concurrency=3))
    reqs = replay.requests
    assert [r.status for r in reqs] == ["ok"] * 15
    events = sorted([(r.t_sent, 1) for r in reqs] + [(r.t_done, -1) for r in reqs])
    level, peak = 0, 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    assert peak == 3
    assert replay.t_end < 5  # it did not wait for the schedule's t=999 s


def chat(delta: dict, completion_tokens: int | None) -> bytes:
    usage = {"prompt_tokens": 5, "completion_tokens": completion_tokens} if completion_tokens is not None else None
    return sse({"choices": [{"index": 0, "delta": delta}], "usage": usage})


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_chat_reasoning_counted_apart_from_content(field):
    """vLLM's chat stream: a role-only opening chunk (no token), reasoning deltas, then content."""
    pieces = [
        chat({"role": "assistant", "content": ""}, 0),
        chat({field: "let me"}, 2),  # two tokens merged into one chunk
        chat({field: " see"}, 3),
        chat({"content": "Yes"}, 4),
        chat({"content": "."}, 5),
        sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 5}}),
        DONE,
    ]
    rec, tokens = asyncio.run(run_against(pieces, delay=0.01))
    assert rec.status == "ok", rec.error
    assert rec.reasoning_tokens == 3 and rec.output_tokens_received == 5
    assert [t.n for t in tokens] == [0, 2, 1, 1, 1]
    # TTFT of any kind starts at the first reasoning chunk, not at the role chunk
    assert tokens[1].t == rec.t_first_token < rec.t_first_content == tokens[3].t


def test_chunks_without_usage_count_one_token_each_if_they_carry_text():
    pieces = [chat({"role": "assistant", "content": ""}, None), chat({"content": "a"}, None),
              chat({"reasoning": "b"}, None), chat({"content": "c"}, None), DONE]
    rec, tokens = asyncio.run(run_against(pieces, delay=0.01))
    assert rec.status == "ok", rec.error
    assert [t.n for t in tokens] == [0, 1, 1, 1]
    assert rec.reasoning_tokens == 1
    assert rec.t_first_token == rec.t_first_content == tokens[1].t


def test_completions_first_content_is_first_token():
    rec, _ = asyncio.run(run_against([token() + token() + USAGE + DONE]))
    assert rec.t_first_content == rec.t_first_token is not None and rec.reasoning_tokens == 0


# vLLM 0.32 with --enable-per-request-metrics: the final usage chunk of a stream (completions
# and chat alike) carries the request's own timings, null fields left out.
VLLM_METRICS = {"time_to_first_token_ms": 41.5, "generation_time_ms": 120.25, "queue_time_ms": 3.0,
                "mean_itl_ms": 60.125, "tokens_per_second": 18.1}


def final_usage(metrics=None, **extra) -> bytes:
    event = {"id": "cmpl-1", "object": "text_completion", "choices": [],
             "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}, **extra}
    if metrics is not None:
        event["metrics"] = metrics
    return sse(event)


def server_timings(rec) -> tuple:
    return rec.server_queue_ms, rec.server_prefill_ms, rec.server_decode_ms, rec.server_itl_ms


def test_the_servers_per_request_timings_are_kept():
    rec, _ = asyncio.run(run_against([token(), token(), token(), final_usage(VLLM_METRICS), DONE]))
    assert rec.status == "ok", rec.error
    assert server_timings(rec) == (3.0, 41.5, 120.25, 60.125)
    # chat: the same object on the same chunk
    pieces = [chat({"role": "assistant", "content": ""}, 0), chat({"content": "a"}, 1), chat({"content": "b"}, 2),
              final_usage(VLLM_METRICS, object="chat.completion.chunk"), DONE]
    rec, _ = asyncio.run(run_against(pieces))
    assert rec.status == "ok" and server_timings(rec) == (3.0, 41.5, 120.25, 60.125)


def test_a_server_without_per_request_timings_leaves_them_null():
    rec, _ = asyncio.run(run_against([token(), USAGE, DONE]))
    assert rec.status == "ok" and server_timings(rec) == (None, None, None, None)
    # one token: vLLM leaves out the mean ITL (nothing to average), the rest stays
    one = {k: v for k, v in VLLM_METRICS.items() if k != "mean_itl_ms"} | {"generation_time_ms": 0}
    rec, _ = asyncio.run(run_against([token(), final_usage(one), DONE]))
    assert server_timings(rec) == (3.0, 41.5, 0.0, None)


@pytest.mark.parametrize("metrics", [
    "fast", [1, 2], None, {"queue_time_ms": "3"}, {"queue_time_ms": True}, {"queue_time_ms": -1},
    {"queue_time_ms": 10**400}, {"queue_time_ms": None}, {"speculative_decoding": {"acceptance": 1}},
])
def test_odd_timings_are_dropped_not_a_failure(metrics):
    """The answer arrived whole: a timing that cannot be a duration is left out, the request stays ok."""
    usage = b'"total_tokens": 8}'
    body = final_usage().replace(usage, usage + b', "metrics": ' + json.dumps(metrics).encode())
    rec, _ = asyncio.run(run_against([token(), body, DONE]))
    assert rec.status == "ok", rec.error
    assert server_timings(rec) == (None, None, None, None)


def test_a_replay_stores_the_timings_where_the_server_sent_them():
    """An endpoint that sends per-request timings for some requests and none for others (another
    server, an older vLLM): every request ok, the timings in the run's table or NULL."""

    def answer(request):
        rid = int(request.rid.removeprefix("ff-"))
        return scripted([token() + token() + token(), final_usage(VLLM_METRICS if rid % 2 else None) + DONE])

    from filledfirst.contracts.records import REQUEST_SCHEMA, to_table

    sched = [ScheduledRequest(i, 0.01 * i, 5, 3, "x") for i in range(4)]
    replay = asyncio.run(replay_against(StreamDouble(answer), sched, request_timeout_s=5, drain_timeout_s=5))
    table = to_table(sorted(replay.requests, key=lambda r: r.request_id), REQUEST_SCHEMA)
    assert table["status"].to_pylist() == ["ok"] * 4
    assert table["server_queue_ms"].to_pylist() == [None, 3.0, None, 3.0]
    assert table["server_prefill_ms"].to_pylist() == [None, 41.5, None, 41.5]


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_the_double_streams_on_its_clock_and_logs_what_it_emitted(api):
    """The double of the tests and the benchmarks: `max_tokens` chunks with usage on each,
    the first `ttft_s` after the request was read, then one per `itl_s`; its emit log holds
    every request and chunk, and the client read each chunk after it was written (one clock)."""
    double = StreamDouble(ttft_s=0.03, itl_s=0.01)
    sched = [ScheduledRequest(i, 0.02 * i, 5, 6, "x") for i in range(10)]
    replay = asyncio.run(replay_against(double, sched, request_timeout_s=5, drain_timeout_s=5, api=api,
                                        prompt="text" if api == "chat" else "token_ids"))
    assert [r.status for r in replay.requests] == ["ok"] * 10
    assert all((r.output_tokens_received, r.chunks) == (6, 6) for r in replay.requests)
    log = {rid: (t_recv, times) for rid, t_recv, times in double.emitted}
    assert sorted(log) == sorted(f"ff-{i}" for i in range(10))
    for r in replay.requests:
        t_recv, emitted = log[f"ff-{r.request_id}"]
        received = [replay.sender.t0 + t.t for t in replay.tokens if t.request_id == r.request_id]
        assert len(emitted) == len(received) == 6
        # chunk i is due ttft + i * itl after the request was read (absolute targets: a late
        # chunk does not delay the next), and timers fire on the millisecond at or after it
        assert all(sent - t_recv > 0.03 + i * 0.01 - 0.001 for i, sent in enumerate(emitted))
        assert all(got >= sent - 1e-9 for got, sent in zip(received, emitted))
