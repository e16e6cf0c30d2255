"""THE test double of an OpenAI-style streaming server, for the tests and the benchmarks
alike (the thing under test is always our client, never this).

It has to cost next to nothing per streamed token, or a benchmark measures the double
instead of the client: an asyncio.Protocol (on uvloop when it runs as a process) that
speaks just enough HTTP/1.1, keep-alive included; every chunk is encoded once per process,
HTTP chunk framing included, and written by a timer shared by every stream due in the
same tick (`tick_s`, 1 ms by default: libuv's timers tick in milliseconds anyway; a tick
of the ITL puts every stream on one step clock, as vLLM's engine emits a token for every
running request per step).

What it answers to POST /v1/completions and /v1/chat/completions, by default: the stream
headers at once, then `max_tokens` chunks, the first `ttft_s` after the request's body
was read and one every `itl_s` after it, each with usage (completion_tokens so far), then
a usage-only chunk and `data: [DONE]` with the last token. Per stream, the emit log
(`emitted`) holds (X-Request-Id, when the body was read, [when each chunk was written]),
all on time.perf_counter (CLOCK_MONOTONIC, the client's clock too).

Tests script the answer instead (`answer`: one `Answer` for every request, or a function
of the `Request`): a stream written piece by piece (after `first_delay`, `delay` apart;
each piece its own write, so events split across reads), an HTTP error with a body, or a
fault of the connection: "close" it without an answer, send the "headers" and then close
it, or "die" (stop listening, then close it). Counters: `requests` (completion requests
read, answered or not), `ids` (their X-Request-Id), `connections` (accepted).

`hold_until=N` holds every synthetic stream before its first token until N completion
requests are open at once (then each goes on as usual): a replay's requests all in flight
together, whatever the machine's speed; `in_flight` and `peak_in_flight` count the open ones.

Also GET /metrics (one vLLM gauge, or `metrics_text`: bytes, or a function of how many
pages were served before, `metrics_served`), /health, /v1/models (`models`) and
/version; with `api_key`, every /v1 path wants `Authorization: Bearer <key>` and answers
401 without it, as vLLM does.

As a process (the benchmarks):

    python tests/helpers/stream_double.py --port 0 --ttft-ms 50 --itl-ms 20 --emit-log FILE [--hold-until N]

raises its own open-file limit to the hard limit, prints its port, serves until its stdin
closes, then writes the emit log as JSON (and with --counts FILE its counters).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import http
import json
import math
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

DEFAULT_METRICS = (b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"
                   b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n"
                   b"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0\n")
FAULTS = ("close", "headers", "die")
COMPLETIONS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}
TEXT = " w"  # every synthetic token's text
MAX_HEAD = 64 * 1024

STREAM_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n")
END = b"0\r\n\r\n"  # the end of a chunked body


def frame(piece: bytes) -> bytes:
    """One piece of a chunked body (an empty one would end the body, so it is nothing)."""
    return b"%x\r\n%s\r\n" % (len(piece), piece) if piece else b""


def sse(event: dict) -> bytes:
    return b"data: " + json.dumps(event).encode() + b"\n\n"


@dataclass(frozen=True)
class Answer:
    """What the double does with one completion request."""

    status: int = 200
    body: bytes = b"overloaded"  # the body of an answer other than 200 (text/plain)
    pieces: Sequence[bytes] | None = None  # a 200's stream, written one by one; None: the synthetic stream
    first_delay: float = 0.0  # seconds before the first piece (or before the fault)
    delay: float = 0.0  # seconds after each piece
    fault: str | None = None  # one of FAULTS: no answer at all

    def __post_init__(self) -> None:
        if self.fault is not None and self.fault not in FAULTS:
            raise ValueError(f"fault {self.fault!r}: one of {FAULTS}")


@dataclass(frozen=True)
class Request:
    """One completion request as the double read it."""

    method: str
    path: str
    headers: dict[str, str]  # names in lower case
    body: bytes
    connection: int  # which connection it came on (0: the first the double accepted)
    on_connection: int  # which completion request on that connection (0: the first)
    n: int  # which completion request overall (0: the first)
    t_recv: float  # time.perf_counter() when its body was read

    @property
    def rid(self) -> str:
        return self.headers.get("x-request-id", "?")


# The synthetic streams' chunks, framed, per API: chunk i carries token i + 1. Grown on
# demand, shared by every stream of the process.
_CHUNKS: dict[str, list[bytes]] = {"completions": [], "chat": []}
_TAILS: dict[int, bytes] = {}


def _chunks(api: str, n: int) -> list[bytes]:
    table = _CHUNKS[api]
    for i in range(len(table), n):
        choice = {"index": 0, "delta": {"content": TEXT}} if api == "chat" else {"index": 0, "text": TEXT}
        table.append(frame(sse({"choices": [choice], "usage": {"prompt_tokens": 1, "completion_tokens": i + 1}})))
    return table


def _tail(n: int) -> bytes:
    """After the last token: the usage-only chunk, [DONE] and the end of the body."""
    tail = _TAILS.get(n)
    if tail is None:
        tail = _TAILS[n] = (frame(sse({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": n}}))
                            + frame(b"data: [DONE]\n\n") + END)
    return tail


class _Stream:
    """One synthetic stream in progress."""

    __slots__ = ("conn", "rid", "t_recv", "chunks", "n", "i", "t0", "itl", "times")

    def __init__(self, conn: _Connection, rid: str, t_recv: float, chunks: list[bytes], n: int, t0: float,
                 itl: float):
        self.conn, self.rid, self.t_recv, self.chunks, self.n = conn, rid, t_recv, chunks, n
        self.i, self.t0, self.itl = 0, t0, itl
        self.times: list[float] = []


class StreamDouble:
    """The double; `serving()` runs it on a free loopback port (in the caller's loop)."""

    def __init__(
        self,
        answer: Answer | Callable[[Request], Answer] | None = None,
        *,
        ttft_s: float = 0.05,
        itl_s: float = 0.02,
        api_key: str | None = None,
        models: Sequence[str] = ("double",),
        metrics_text: bytes | Callable[[int], bytes] = DEFAULT_METRICS,
        tick_s: float = 0.001,
        hold_until: int | None = None,
    ):
        self.answer = answer
        self.ttft_s, self.itl_s = ttft_s, itl_s
        self.api_key = api_key
        self.models = tuple(models)
        self.metrics_text = metrics_text
        self.metrics_served = 0
        self.emitted: list[tuple[str, float, list[float]]] = []  # the emit log
        self.requests = 0
        self.ids: list[str | None] = []
        self.connections = 0
        self.server: asyncio.Server | None = None
        self._open: set[_Connection] = set()
        self._ticks: dict[int, list[_Stream]] = {}  # tick of the loop's clock -> the streams due then
        self._loop: asyncio.AbstractEventLoop | None = None
        self._per_s = 1 / tick_s
        self.hold_until = hold_until
        self._held: list[_Stream] = []  # waiting for hold_until open requests
        self.in_flight = 0  # completion requests read and not yet answered whole (or given up)
        self.peak_in_flight = 0

    # ---------------------------------------------------------------- serving

    async def start(self, host: str = "127.0.0.1", port: int = 0, backlog: int = 4096) -> str:
        self._loop = asyncio.get_running_loop()
        self.server = await self._loop.create_server(lambda: _Connection(self), host, port, backlog=backlog)
        return f"http://{host}:{self.port}"

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for conn in list(self._open):
            conn.close()
        await asyncio.sleep(0)  # let the transports report their close

    @contextlib.asynccontextmanager
    async def serving(self, host: str = "127.0.0.1", port: int = 0):
        """Yields the base URL."""
        base = await self.start(host, port)
        try:
            yield base
        finally:
            await self.stop()

    @contextlib.contextmanager
    def serving_in_thread(self, host: str = "127.0.0.1", port: int = 0):
        """For code that is not async (the CLI, the runner): the double on a loop of its
        own in a thread; yields the base URL."""
        started: concurrent.futures.Future = concurrent.futures.Future()
        loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                started.set_result(loop.run_until_complete(self.start(host, port)))
            except BaseException as exc:  # handed to the caller
                started.set_exception(exc)
                return
            loop.run_forever()
            loop.run_until_complete(self.stop())
            loop.close()

        thread = threading.Thread(target=run, name="stream-double", daemon=True)
        thread.start()
        try:
            yield started.result(timeout=10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)

    # ---------------------------------------------------------------- requests

    def _handle(self, conn: _Connection, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        path = path.split("?", 1)[0]
        if (self.api_key is not None and path.startswith("/v1")
                and headers.get("authorization") != f"Bearer {self.api_key}"):
            return conn.respond(401, b'{"error": "Unauthorized"}', "application/json")
        if method == "GET":
            if path == "/metrics":
                page = self.metrics_text(self.metrics_served) if callable(self.metrics_text) else self.metrics_text
                self.metrics_served += 1
                return conn.respond(200, page, "text/plain; version=0.0.4")
            if path == "/health":
                return conn.respond(200, b"", "text/plain")
            if path == "/v1/models":
                data = [{"id": m, "object": "model", "owned_by": "double"} for m in self.models]
                return conn.respond(200, json.dumps({"object": "list", "data": data}).encode(), "application/json")
            if path == "/version":
                return conn.respond(200, b'{"version": "double"}', "application/json")
        if method != "POST" or path not in COMPLETIONS:
            return conn.respond(404, b"Not Found", "text/plain")
        t_recv = time.perf_counter()
        request = Request(method, path, headers, body, conn.index, conn.on_connection, self.requests, t_recv)
        self.requests += 1
        conn.on_connection += 1
        conn.answering = True
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        self.ids.append(headers.get("x-request-id"))
        answer = self.answer(request) if callable(self.answer) else self.answer
        if answer is None or (answer.pieces is None and answer.status == 200 and answer.fault is None):
            return self._synthetic(conn, request)
        if answer.fault is not None:
            if answer.first_delay > 0:
                conn.later(answer.first_delay, self._fault, conn, answer.fault)
            else:
                self._fault(conn, answer.fault)
            return
        if answer.status != 200:
            return conn.respond(answer.status, answer.body, "text/plain")
        conn.transport.write(STREAM_HEAD)
        times: list[float] = []
        self.emitted.append((request.rid, t_recv, times))
        conn.later(answer.first_delay, self._piece, conn, [frame(p) for p in answer.pieces], 0, answer.delay, times)

    def _fault(self, conn: _Connection, fault: str) -> None:
        if conn.transport is None:
            return
        if fault == "headers":
            conn.transport.write(STREAM_HEAD)
        elif fault == "die":
            self.server.close()  # stop listening; the connections stay
        conn.close()

    def _piece(self, conn: _Connection, pieces: list[bytes], i: int, delay: float, times: list[float]) -> None:
        """A scripted stream: piece i, then the next after `delay`, then the end of the body."""
        if conn.transport is None:
            return
        if i == len(pieces):
            conn.transport.write(END)
            return conn.finish()
        last = i == len(pieces) - 1 and delay == 0  # then the end of the body goes with it
        if pieces[i] or last:
            conn.transport.write(pieces[i] + END if last else pieces[i])
        if pieces[i]:
            times.append(time.perf_counter())
        if last:
            return conn.finish()
        conn.later(delay, self._piece, conn, pieces, i + 1, delay, times)

    def _synthetic(self, conn: _Connection, request: Request) -> None:
        try:
            body = json.loads(request.body)
            n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 0)
        except (ValueError, TypeError, AttributeError):
            return conn.respond(400, b"the synthetic stream needs a JSON body with max_tokens", "text/plain")
        conn.transport.write(STREAM_HEAD)
        if n == 0:
            conn.transport.write(_tail(0))
            self.emitted.append((request.rid, request.t_recv, []))
            return conn.finish()
        chunks = _chunks(COMPLETIONS[request.path], n)[:n]
        chunks[-1] += _tail(n)  # the last token, its usage and [DONE] in one write
        # Due times in ticks of the shared timers: chunk i at ceil(t0 + i * step).
        stream = _Stream(conn, request.rid, request.t_recv, chunks, n,
                         (self._loop.time() + self.ttft_s) * self._per_s, self.itl_s * self._per_s)
        if self.hold_until is not None:
            self._held.append(stream)
            if self.in_flight < self.hold_until:
                return
            held, self._held = self._held, []
            for s in held:  # their first token counts from now
                s.t0 = (self._loop.time() + self.ttft_s) * self._per_s
                self._at(math.ceil(s.t0), s)
            return
        self._at(math.ceil(stream.t0), stream)

    # ---------------------------------------------------------------- the shared timers

    def _at(self, tick: int, stream: _Stream) -> None:
        bucket = self._ticks.get(tick)
        if bucket is None:
            self._ticks[tick] = [stream]
            self._loop.call_at(tick / self._per_s, self._fire, tick)
        else:
            bucket.append(stream)

    def _fire(self, tick: int) -> None:
        """Every stream due in this tick gets its next chunk: the hot path, kept lean."""
        perf_counter, ceil, ticks, at = time.perf_counter, math.ceil, self._ticks, self._at
        for s in ticks.pop(tick):
            transport = s.conn.transport
            if transport is None:  # the client went away: what was written stays in the log
                self.emitted.append((s.rid, s.t_recv, s.times))
                continue
            i = s.i
            transport.write(s.chunks[i])
            s.times.append(perf_counter())
            i += 1
            if i < s.n:
                s.i = i
                due = ceil(s.t0 + i * s.itl)
                bucket = ticks.get(due)
                if bucket is None:
                    at(due, s)
                else:
                    bucket.append(s)
            else:
                self.emitted.append((s.rid, s.t_recv, s.times))
                s.conn.finish()


class _Connection(asyncio.Protocol):
    """One client connection: requests one at a time (the next waits in the buffer)."""

    def __init__(self, double: StreamDouble):
        self.double = double
        self.index = double.connections
        double.connections += 1
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.head: tuple[str, str, dict[str, str], int] | None = None  # waiting for its body
        self.busy = False  # answering; what follows waits
        self.close_after = False
        self.on_connection = 0
        self.pending: asyncio.Handle | None = None  # the next step of a scripted answer
        self.answering = False  # a completion request of this connection is open (in_flight)

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.double._open.add(self)

    def _answered(self) -> None:
        if self.answering:
            self.answering = False
            self.double.in_flight -= 1

    def connection_lost(self, exc) -> None:
        self._answered()
        self.transport = None
        self.double._open.discard(self)
        if self.pending is not None:
            self.pending.cancel()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._next()

    def _next(self) -> None:
        while not self.busy and self.transport is not None:
            if self.head is None:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self.buf) > MAX_HEAD:
                        self.close()
                    return
                lines = self.buf[:end].decode("latin-1").split("\r\n")
                del self.buf[: end + 4]
                method, _, rest = lines[0].partition(" ")
                path, _, version = rest.partition(" ")
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                self.close_after = headers.get("connection", "").lower() == "close" or version == "HTTP/1.0"
                if "chunked" in headers.get("transfer-encoding", ""):
                    self.close_after = True
                    self.busy = True
                    return self.respond(411, b"send a Content-Length", "text/plain")
                self.head = (method, path, headers, int(headers.get("content-length") or 0))
            method, path, headers, length = self.head
            if len(self.buf) < length:
                return
            body = bytes(self.buf[:length])
            del self.buf[:length]
            self.head = None
            self.busy = True
            self.double._handle(self, method, path, headers, body)

    def respond(self, status: int, body: bytes, content_type: str) -> None:
        try:
            reason = http.HTTPStatus(status).phrase
        except ValueError:
            reason = "Unknown"
        self.transport.write(b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (
            status, reason.encode(), content_type.encode(), len(body), body))
        self.finish()

    def finish(self) -> None:
        """The answer is out: close if asked to, else read the next request."""
        self.busy = False
        self._answered()
        if self.transport is None:
            return
        if self.close_after:
            return self.close()
        if self.buf:
            self.double._loop.call_soon(self._next)

    def later(self, delay: float, fn, *args) -> None:
        """`fn(*args)` after `delay` s (at the loop's next turn for 0), unless the connection
        closes first. A scripted answer is one chain of these: one pending at a time."""
        loop = self.double._loop
        self.pending = loop.call_later(delay, fn, *args) if delay > 0 else loop.call_soon(fn, *args)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


# ---------------------------------------------------------------- as a process


async def _serve(args) -> None:
    double = StreamDouble(ttft_s=args.ttft_ms / 1000, itl_s=args.itl_ms / 1000, tick_s=args.tick_ms / 1000,
                          hold_until=args.hold_until)
    await double.start(port=args.port)
    print(double.port, flush=True)  # the port, for the caller
    try:
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until stdin closes
    finally:
        with open(args.emit_log, "w") as f:
            json.dump(double.emitted, f)
        if args.counts:
            with open(args.counts, "w") as f:
                json.dump({"requests": double.requests, "connections": double.connections,
                           "peak_in_flight": double.peak_in_flight}, f)
        await double.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft-ms", type=float, default=50)
    p.add_argument("--itl-ms", type=float, default=20)
    p.add_argument("--tick-ms", type=float, default=1.0)
    p.add_argument("--emit-log", required=True)
    p.add_argument("--hold-until", type=int, default=None, help="hold first tokens until N requests are open")
    p.add_argument("--counts", default=None, help="write the counters here as JSON at the end")
    p.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop",
                   help="uvloop when it is installed (the default), else asyncio")
    args = p.parse_args()
    import resource

    # A connection per request in flight: as many descriptors as the machine lets it have.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            uvloop = None
        if uvloop is not None:
            return uvloop.run(_serve(args))
    asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
