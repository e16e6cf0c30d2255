"""Streamed HTTP/1.1 exchanges on asyncio's Protocol API, for the one request the load
generator sends thousands of times a second.

Why not aiohttp here (it still serves the scraper and the endpoint check): every chunk it
reads goes through its response buffer, wakes the request's task and comes back through
an async iterator, and at a 200 req/s replay that was most of the client's CPU
(benchmarks/README.md). Here the response is parsed by httptools (llhttp, uvicorn's
parser) inside the event loop's read callback, and each body piece goes straight to a
`Sink` with the one timestamp of the read it came in: no task wakes until the exchange
ends.

Connections are kept alive and reused, newest first, and dropped once idle for
`keepalive_s` or as soon as the server closes them; a request on a reused connection that
the server had closed fails with `Disconnected(reused=True, answered=False)`, which the
caller may send once more on a fresh connection (`fresh=True`: opened for it, closed after).
"""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Callable, Protocol
from urllib.parse import urlsplit

import httptools

_USER_AGENT = b"filledfirst"
# The most an answer's status line and headers may take: httptools keeps an unfinished
# header in memory, so a server whose headers never end would grow the client until the
# request timeout. Far above real ones (vLLM's are a few hundred bytes; servers commonly
# refuse requests with more than 8-16 KiB of headers).
MAX_HEAD_BYTES = 64 * 1024


class HTTPFailure(Exception):
    """An exchange that ended without a whole answer (the message says why)."""


class ConnectFailed(HTTPFailure):
    """No connection: refused, unreachable, a name that does not resolve."""


class OutOfFiles(ConnectFailed):
    """No descriptor for the connection (EMFILE, ENFILE): the client's limit, not the
    server's doing; the request never left (filledfirst.loadgen.fdlimit)."""

    def __init__(self, exc: OSError):
        super().__init__(str(exc))
        self.os_error = exc


class ConnectTimeout(HTTPFailure):
    """No connection within the connect timeout."""


class Disconnected(HTTPFailure):
    """The connection broke during the exchange. `answered`: any byte of the answer had
    arrived; `reused`: the connection came from the pool (so the server may have closed it
    while it was idle, before this request reached it)."""

    def __init__(self, message: str, *, reused: bool, answered: bool):
        super().__init__(message)
        self.reused, self.answered = reused, answered


class InvalidAnswer(HTTPFailure):
    """Bytes that are not an HTTP/1.1 answer."""


class Sink(Protocol):
    """What receives one answer. `body` gets each piece with the time of the read that
    brought it and returns False once it needs no more (the exchange then ends, and the
    connection goes back to the pool if the answer completes on it)."""

    def status(self, code: int) -> None: ...

    def body(self, t: float, data: bytes) -> bool: ...

    def end(self) -> None: ...


@dataclass(frozen=True)
class Target:
    """Where the requests go: the endpoint's URL taken apart once."""

    host: str
    port: int
    tls: bool
    path: bytes  # with its query

    @classmethod
    def parse(cls, url: str) -> Target:
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = u.scheme == "https"
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        return cls(u.hostname, u.port or (443 if tls else 80), tls, path.encode())

    @property
    def host_header(self) -> bytes:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.tls else 80
        return (host if self.port == default else f"{host}:{self.port}").encode()


def _header_lines(headers: dict[str, str]) -> bytes:
    return b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items())


class _Connection(asyncio.Protocol):
    """One keep-alive connection; at most one exchange on it at a time."""

    def __init__(self, pool: Pool, fresh: bool):
        self._pool, self.fresh = pool, fresh
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser: httptools.HttpResponseParser | None = None
        self._sink: Sink | None = None  # while the caller waits for the answer
        self._done: asyncio.Future | None = None
        self._clock: Callable[[], float] = time.perf_counter
        self._t = 0.0
        self._answered = self._reused = self._framed = self._headers_done = False
        self._head_bytes = 0  # read before the headers were complete

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:  # one request, one write: never held back by Nagle
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self._parser is None:
            self.close()  # bytes nobody asked for: this connection cannot be trusted again
            return
        self._answered = True
        self._t = self._clock()  # everything in one read shares one timestamp
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:  # the sink raised: its caller hears of it
            self._fail(exc.__context__ or exc)
            return
        except httptools.HttpParserError as exc:
            self._fail(InvalidAnswer(f"invalid HTTP answer: {exc}"))
            return
        if not self._headers_done and self._parser is not None:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._fail(InvalidAnswer(f"invalid HTTP answer: headers longer than {MAX_HEAD_BYTES:,} bytes"))

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool.forget(self)
        if self._sink is not None:
            if self._parser is not None and self._headers_done and not self._framed:
                self._finish()  # an answer whose body runs until the connection closes
            else:
                why = "the server closed the connection" + (f" ({exc})" if exc else "")
                self._fail(Disconnected(why + (" mid-answer" if self._answered else " before answering"),
                                        reused=self._reused, answered=self._answered))

    # -- httptools callbacks ---------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length" or (name == b"transfer-encoding" and b"chunked" in value.lower()):
            self._framed = True

    def on_headers_complete(self) -> None:
        self._headers_done = True
        if self._sink is not None and self._parser is not None:
            self._sink.status(self._parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        if self._sink is not None and not self._sink.body(self._t, body):
            self._finish()

    def on_message_complete(self) -> None:
        if self._sink is not None:
            self._finish()
        keep = self._parser is not None and self._parser.should_keep_alive()
        self._parser = None
        if keep and not self.fresh and not self.closed:
            self._pool.release(self)
        else:
            self.close()

    # -- the exchange ----------------------------------------------------------------------

    def start(self, request: bytes, sink: Sink, clock: Callable[[], float], reused: bool) -> asyncio.Future:
        self._parser = httptools.HttpResponseParser(self)
        self._sink, self._clock, self._reused = sink, clock, reused
        self._answered = self._framed = self._headers_done = False
        self._head_bytes = 0
        self._done = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(request)
        return self._done

    def _finish(self) -> None:
        sink, done = self._sink, self._done
        self._sink = None
        if sink is not None:
            sink.end()
        if done is not None and not done.done():
            done.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        self._sink, done = None, self._done
        if done is not None and not done.done():
            done.set_exception(exc)
        self.close()

    def abandon(self) -> None:
        """The caller stopped waiting (a timeout, a cancel): the answer is not wanted."""
        if self._sink is not None:
            self._sink = None
            self.close()

    def close(self) -> None:
        self.closed = True
        self._parser = None
        if self.transport is not None:
            self.transport.abort()  # no lingering half-read answer; the socket goes at once
        self._pool.forget(self)


class Pool:
    """Keep-alive connections to one target, no cap on how many (an open loop must never
    wait for a connection); `headers` go with every request."""

    def __init__(self, target: Target, headers: dict[str, str] | None = None, *, connect_timeout_s: float | None,
                 keepalive_s: float = 3.0):
        self.target = target
        self.connect_timeout_s = connect_timeout_s
        # Below uvicorn's 5 s keep-alive, so a pooled connection is rarely one the server
        # is about to close.
        self.keepalive_s = keepalive_s
        self._head = (b"POST " + target.path + b" HTTP/1.1\r\nHost: " + target.host_header
                      + b"\r\nUser-Agent: " + _USER_AGENT + b"\r\nAccept: text/event-stream, */*\r\n"
                      + b"Accept-Encoding: identity\r\nContent-Type: application/json\r\n"
                      + _header_lines(headers or {}))
        self._idle: list[_Connection] = []  # newest last
        self._all: set[_Connection] = set()
        self._ssl = ssl.create_default_context() if target.tls else None
        self.opened = 0  # connections opened, for tests and benchmarks

    def request_bytes(self, body: bytes, headers: dict[str, str]) -> bytes:
        return self._head + _header_lines(headers) + b"Content-Length: %d\r\n\r\n" % len(body) + body

    async def exchange(self, body: bytes, headers: dict[str, str], sink: Sink, clock: Callable[[], float], *,
                       fresh: bool = False) -> None:
        """POST `body` and feed the answer to `sink` until it is whole or the sink has had
        enough; every failure raises an HTTPFailure (cancelling drops the connection)."""
        conn, reused = (None, False) if fresh else (self._take(), True)
        if conn is None:
            conn, reused = await self._open(fresh), False
        done = conn.start(self.request_bytes(body, headers), sink, clock, reused)
        try:
            await done
        finally:
            if not done.done() or done.cancelled():
                conn.abandon()

    def _take(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and not conn.transport.is_closing() and now - conn.idle_since < self.keepalive_s:
                return conn
            conn.close()
        return None

    async def _open(self, fresh: bool) -> _Connection:
        loop = asyncio.get_running_loop()
        t = self.target
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(lambda: _Connection(self, fresh), t.host, t.port,
                                                       ssl=self._ssl)
        except TimeoutError:
            raise ConnectTimeout(f"could not connect within {self.connect_timeout_s} s") from None
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                raise OutOfFiles(exc) from None
            raise ConnectFailed(f"could not connect to {t.host}:{t.port}: {exc}") from None
        self.opened += 1
        self._all.add(conn)
        return conn

    def release(self, conn: _Connection) -> None:
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    def forget(self, conn: _Connection) -> None:
        self._all.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)

    def close(self) -> None:
        for conn in list(self._all):
            conn.close()
        self._idle.clear()

    async def __aenter__(self) -> Pool:
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()
