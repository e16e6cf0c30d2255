"""Our SSE client fuzzed with hypothesis against the loopback test double (tests/helpers).

Whatever a server sends, the client never raises and every request becomes one record
that can be written (status in the known set, an error text when not ok); a well-formed
stream cut anywhere across reads, with any mix of LF, CRLF and CR line ends, parses to
exactly what was sent. Derandomized, so CI sees the same examples every time.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import NamedTuple

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from filledfirst.contracts.records import REQUEST_SCHEMA, STATUSES, TOKEN_SCHEMA, ScheduledRequest, to_table
from filledfirst.engines.vllm import PER_REQUEST
from filledfirst.loadgen.stream import MAX_LINE_BYTES, UNREADABLE, SSEData

from helpers.stream_client import DONE, replay_against, run_against, scripted
from helpers.stream_double import StreamDouble

FUZZ = dict(derandomize=True, database=None, deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PROMPT = 7
MIB = 1 << 20

# --- well-formed streams, with what they must parse to --------------------------------------

LINE_ENDS = st.sampled_from([b"\n", b"\r\n", b"\r"])
NOISE = st.sampled_from([b": keep-alive", b":", b"event: completion", b"id: 42", b"retry: 1000", b""])
# Any text but lone surrogates (JSON cannot carry them as UTF-8); sent raw as UTF-8 half the
# time, so a cut can fall inside a multi-byte character.
TEXT = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=8)
# vLLM's per-request timings on the final usage chunk (--enable-per-request-metrics): any
# subset of its fields, each a duration it could have measured.
DURATION = st.floats(0, 1e7, allow_nan=False) | st.integers(0, 10**7)
TIMINGS = st.none() | st.fixed_dictionaries({}, optional={k: DURATION for k in PER_REQUEST.values()})


@st.composite
def well_formed(draw):
    """(body, data payloads, expected summary) of a stream vLLM could send: completions or
    chat, with or without per-chunk usage, keep-alives and other fields in between."""
    chat = draw(st.booleans())
    per_chunk_usage = draw(st.booleans())
    ascii_only = draw(st.booleans())
    ends = draw(st.lists(LINE_ENDS, min_size=1, max_size=3))  # one style, or a mix
    kinds = ["content", "reasoning", "role"] if chat else ["content"]
    chunks = draw(st.lists(st.tuples(st.sampled_from(kinds), TEXT, st.integers(1, 3)), max_size=8))

    events, ns, reasoning, total = [], [], 0, 0
    for kind, text, k in chunks:
        n = 0 if kind == "role" else (k if per_chunk_usage else 1)
        total += n
        reasoning += n if kind == "reasoning" else 0
        ns.append(n)
        if chat:
            delta = {"role": "assistant", "content": ""} if kind == "role" else {kind: text}
            choice = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": text}
        usage = {"prompt_tokens": PROMPT, "completion_tokens": total} if per_chunk_usage else None
        events.append({"choices": [choice], "usage": usage})
    final = {"choices": [], "usage": {"prompt_tokens": PROMPT, "completion_tokens": total}}
    timings = draw(TIMINGS)
    if timings is not None:
        final["metrics"] = timings
    events.append(final)

    payloads = [json.dumps(e, ensure_ascii=ascii_only).encode() for e in events] + [b"[DONE]"]
    lines = []
    for p in payloads:
        lines += draw(st.lists(NOISE, max_size=2))
        lines += [draw(st.sampled_from([b"data: ", b"data:"])) + p, b""]  # a blank line ends the event
    body = b"".join(line + draw(st.sampled_from(ends)) for line in lines)
    expected = {"status": "ok", "error": None, "chunks": len(chunks), "n": ns, "reasoning": reasoning,
                "usage": (PROMPT, total), "first_token": any(ns),
                "server": {ours: None if (v := (timings or {}).get(theirs)) is None else float(v)
                           for ours, theirs in PER_REQUEST.items()}}
    return body, payloads, expected


def cut(body: bytes, at: list[int]) -> list[bytes]:
    """`body` in pieces, cut at each of `at` (taken modulo its length)."""
    edges = sorted({0, len(body), *(i % (len(body) + 1) for i in at)})
    return [body[a:b] for a, b in zip(edges, edges[1:])]


def summary(rec, tokens) -> dict:
    return {"status": rec.status, "error": rec.error, "chunks": rec.chunks, "n": [t.n for t in tokens],
            "reasoning": rec.reasoning_tokens, "usage": (rec.prompt_tokens_received, rec.output_tokens_received),
            "first_token": rec.t_first_token is not None, "server": {k: getattr(rec, k) for k in PER_REQUEST}}


@settings(max_examples=300, **FUZZ)
@given(well_formed(), st.lists(st.integers(0, 2**16), max_size=40))
def test_parser_output_does_not_depend_on_read_boundaries(stream, at):
    body, payloads, _ = stream
    whole = SSEData().feed(body)
    parser = SSEData()
    split = [d for piece in cut(body, at) for d in parser.feed(piece)]
    assert whole == split == payloads


_one_event = st.builds(lambda pad, payload, end: b"data:" + pad + payload + end, st.sampled_from([b"", b" ", b"\t"]),
                       st.binary(max_size=40), st.sampled_from([b"\n\n", b"\r\n\r\n", b"\n", b"\n\n\n", b" \n\n"]))


@settings(max_examples=500, **FUZZ)
@given(st.lists(_one_event | st.binary(max_size=48), min_size=1, max_size=4))
def test_the_one_event_per_read_shortcut_gives_what_the_general_path_gives(reads):
    fast, general = SSEData(), SSEData()
    assert [fast.feed(r) for r in reads] == [general._lines(r) for r in reads]


@settings(max_examples=40, **FUZZ)
@given(well_formed(), st.lists(st.integers(0, 2**16), min_size=1, max_size=12))
def test_well_formed_stream_split_anywhere_parses_like_the_unsplit_one(stream, at):
    body, _, expected = stream
    whole = summary(*asyncio.run(run_against([body])))
    # A short pause after each piece makes it a read of its own (without it, loopback
    # coalesces about half of them).
    split = summary(*asyncio.run(run_against(cut(body, at), delay=0.0003)))
    assert whole == split == expected


def test_a_long_line_costs_linear_time():
    """4 MiB without a line break in 1 KiB reads took 16 s (quadratic) before the fix: the
    unfinished line was joined and re-split at every read. A line just under the cap
    (MAX_LINE_BYTES) is one buffer grown in place, and parses."""
    parser = SSEData()
    assert parser.feed(b"data: ") == []
    buffer = parser._partial
    n = (MAX_LINE_BYTES - 8) // 1024
    for _ in range(n):
        assert parser.feed(b"x" * 1024) == []
        assert parser._partial is buffer
    assert parser.feed(b"\ndata: [DONE]\n") == [b"x" * (1024 * n), b"[DONE]"]


# --- anything at all: never an exception, always one writable record --------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def _data(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode()


ODD_EVENT = st.one_of(
    JSON.map(_data),  # any JSON value as an event
    st.builds(lambda c, u: _data({"choices": c, "usage": u}), JSON, JSON),  # the right keys, any values
    st.builds(lambda t, d, u: _data({"choices": [{"text": t, "delta": d}], "usage": u}), JSON, JSON,
              st.fixed_dictionaries({"prompt_tokens": JSON, "completion_tokens": JSON})),
    st.builds(lambda e: _data({"error": e}), JSON),  # an error event
    # per-request timings of any shape, on a final usage chunk
    st.builds(lambda m: _data({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}, "metrics": m}),
              JSON | st.fixed_dictionaries({}, optional={k: JSON for k in PER_REQUEST.values()})),
)
LINE = st.one_of(
    st.sampled_from([
        _data({"choices": [{"index": 0, "text": "w"}], "usage": None}),
        _data({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}),
        b"data: [DONE]", b": keep-alive", b"", b"data:", b"data: {not json",
        b'data: {"choices": [{"text": "\xff\xfe"}]}',
    ]),
    ODD_EVENT,
    st.binary(max_size=40),  # garbage, non-UTF-8 included
    st.binary(max_size=8).map(lambda b: b"data: " + b),
)
# Lines just under and just over the cap (MAX_LINE_BYTES): read, or the request failed.
HUGE = st.sampled_from([b"x", b"data: x", b"data: {\"choices\": \""]).flatmap(
    lambda head: st.integers(MAX_LINE_BYTES - 4096, MAX_LINE_BYTES + 4096).map(lambda n: head + b"y" * n))


class Answer(NamedTuple):
    status: int
    error_body: bytes | None  # the body when the status is not 200
    pieces: list[bytes]  # the stream, as written

    def __repr__(self) -> str:  # a failing example with a 1 MiB line stays readable
        short = [p if len(p) <= 120 else f"<{len(p):,} bytes: {p[:40]!r}...>" for p in self.pieces]
        return f"Answer({self.status}, {self.error_body!r}, {short})"


@st.composite
def anything(draw) -> Answer:
    """What a broken, hostile or merely odd server sends."""
    status = draw(st.sampled_from([200, 200, 200, 200, 400, 429, 500, 503]))
    if status != 200:
        return Answer(status, draw(st.binary(max_size=64)), [])
    lines = draw(st.lists(LINE, max_size=10))
    if draw(st.integers(0, 9)) == 0:  # rarely: a line about as long as the cap, perhaps never ended
        lines.insert(draw(st.integers(0, len(lines))), draw(HUGE))
    body = b"".join(line + draw(LINE_ENDS) for line in lines)
    if draw(st.booleans()):
        body += draw(st.sampled_from([b"", DONE]))
    return Answer(status, None, cut(body, draw(st.lists(st.integers(0, len(body)), max_size=6))))


def assert_one_good_record(rec, tokens) -> None:
    assert rec.status in STATUSES and rec.status != "not_sent"
    if rec.status == "ok":
        assert rec.error is None and rec.http_status == 200
    else:
        assert isinstance(rec.error, str) and rec.error.strip(), rec
        assert len(rec.error) < 1100  # a huge line is quoted, not copied
        assert UNREADABLE not in rec.error, rec.error  # the last-resort catch never had to fire
    assert rec.t_sent is not None and rec.t_done is not None and rec.t_sent <= rec.t_done
    assert rec.chunks == len(tokens) and [t.index for t in tokens] == list(range(len(tokens)))
    for field in PER_REQUEST:  # a duration or nothing
        value = getattr(rec, field)
        assert value is None or (type(value) is float and math.isfinite(value) and value >= 0), (field, value)
    # what the run folder will hold: a wrong type here would fail the whole run's write
    to_table([rec], REQUEST_SCHEMA)
    to_table(tokens, TOKEN_SCHEMA)


@settings(max_examples=250, **FUZZ)
@given(anything())
def test_any_answer_becomes_one_record(answer):
    status, error_body, pieces = answer
    rec, tokens = asyncio.run(run_against(pieces, status=status, error_body=error_body))
    assert_one_good_record(rec, tokens)
    if status != 200:
        assert rec.http_status == status and rec.status == ("rejected" if status in (429, 503) else "http_error")
    elif rec.status == "ok":
        assert b"[DONE]" in b"".join(pieces)


def test_known_answers_become_the_right_records():
    """One of each kind, so a change of mapping shows even if the fuzz never draws it."""
    cases = [
        (200, None, [b"data: {\"choices\": \"abc\"}\n\n", DONE], "http_error", "unexpected event"),
        (200, None, [b"data: {\"choices\": [], \"usage\": {\"completion_tokens\": \"3\"}}\n\n", DONE],
         "http_error", "unexpected event"),
        (200, None, [b"data: {\"choices\": [], \"usage\": {\"completion_tokens\": 1e30}}\n\n", DONE],
         "http_error", "unexpected event"),
        (200, None, [b"data: {\"choices\": [], \"usage\": [1]}\n\n", DONE], "http_error", "unexpected event"),
        (200, None, [b"data: {\"error\": {\"message\": \"boom\"}, \"usage\": 3}\n\n"], "http_error", "boom"),
        (200, None, [b"data: \xff\xfe\n\n", DONE], "http_error", "invalid JSON"),
        (200, None, [b"data: " + b"y" * (MAX_LINE_BYTES // 2) + b"\n\n", DONE], "http_error", "invalid JSON"),
        (200, None, [b"x" * (MAX_LINE_BYTES // 2)], "disconnected", "[DONE]"),
        (200, None, [b"data: " + b"y" * (2 * MIB) + b"\n\n", DONE], "http_error", "longer than"),
        (200, None, [b"x" * (2 * MIB)], "http_error", "longer than"),
        (500, b"\xff\xfe not UTF-8", [], "http_error", "not UTF-8"),
        (503, b"", [], "rejected", "HTTP 503"),
        (400, b" \n", [], "http_error", "HTTP 400"),
    ]
    for status, error_body, pieces, want, text in cases:
        rec, tokens = asyncio.run(run_against(pieces, status=status, error_body=error_body))
        assert_one_good_record(rec, tokens)
        assert rec.status == want and text in rec.error, (pieces[:1], rec)


# --- a whole replay: one record per scheduled request, whatever each answer was ---------------


@settings(max_examples=15, **FUZZ)
@given(st.lists(anything(), min_size=1, max_size=8), st.sampled_from(["open", "closed"]))
def test_a_replay_keeps_one_record_per_request(answers, mode):
    def completions(request):
        # the client's X-Request-Id says which answer this request gets
        answer = answers[int(request.rid.removeprefix("ff-"))]
        return scripted(answer.pieces, status=answer.status, error_body=answer.error_body)

    sched = [ScheduledRequest(i, 0.0, 5, 3, "x") for i in range(len(answers))]
    replay = asyncio.run(replay_against(StreamDouble(completions), sched, request_timeout_s=10, drain_timeout_s=10,
                                        mode=mode, concurrency=2 if mode == "closed" else None))
    assert sorted(r.request_id for r in replay.requests) == list(range(len(answers)))
    assert replay.interrupted is None
    for rec in replay.requests:
        assert_one_good_record(rec, [t for t in replay.tokens if t.request_id == rec.request_id])
    to_table(replay.tokens, TOKEN_SCHEMA)
