"""One replay split across worker processes, each with its own event loop and connections.

Why: one Python process streams about 50k tokens/s before its core is full
(benchmarks/README.md); past that, the client's own lag would be blamed on the server.

- Open loop: request k of the schedule (in time order) goes to worker k mod N, and keeps
  its scheduled time: every worker's arrivals are the schedule's, thinned.
- Closed loop: the concurrency is split across the workers as evenly as it goes (never
  more workers than concurrency), and each worker takes the requests in proportion.
- One clock: time.perf_counter is CLOCK_MONOTONIC, the same in every process of the
  machine. The workers start (spawned: no copy of a running event loop), build their
  bodies, say they are ready; then the main process picks the start instant and sends it
  to all, so every record is on the main process's clock, scrapes included.
- The main process keeps the scraper, the progress line, the watch on the server and the
  signals; a stop (Ctrl-C, SIGTERM, the server died) is sent to every worker, which stops
  sending and cancels what is open with the reason, as a single process does. A worker
  ignores SIGINT and SIGTERM (the main process decides) and dies with the main process
  (PR_SET_PDEATHSIG), so no worker outlives a killed pipeline.
- Nothing lost: each worker sends back its records at the end; a worker that dies first
  leaves its requests `not_sent` with the reason, the others are stopped (the run no
  longer offers the load asked for), and the run is partial.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import multiprocessing as mp
import os
import signal
import time
from multiprocessing.connection import Connection
from typing import Callable

from filledfirst.contracts.records import RequestRecord, ScheduledRequest
from filledfirst.interrupts import set_parent_death_signal
from filledfirst.loadgen.fdlimit import raise_open_file_limit
from filledfirst.loadgen.sender import Sender

log = logging.getLogger(__name__)

# Tokens per second one client process streams at a full core: 20 ms of CPU per 1,000
# tokens, rounded up from the 15-18 ms measured at 100-200 req/s (benchmarks/README.md,
# client_fidelity). `auto` plans for half of it.
TOKENS_PER_CORE_S = 50_000
_AUTO_SHARE = 0.5
_STOP_GRACE_S = 30.0  # after a stop, how long a worker may take to send its records back
_START_TIMEOUT_S = 120.0  # a spawned worker imports aiohttp and pyarrow, and builds its bodies
PROGRESS_EVERY_S = 1.0


@dataclasses.dataclass(frozen=True, slots=True)
class Shard:
    index: int
    schedule: list[ScheduledRequest]
    concurrency: int | None  # closed loop: this worker's share


def shard(schedule: list[ScheduledRequest], workers: int, mode: str, concurrency: int | None) -> list[Shard]:
    """The schedule split for `workers` processes (module docstring); every request in
    exactly one shard, in time order within it."""
    ordered = sorted(schedule, key=lambda r: (r.t_offset_s, r.request_id))
    if mode == "closed":
        assert concurrency
        workers = max(1, min(workers, concurrency))
        shares = [concurrency // workers + (i < concurrency % workers) for i in range(workers)]
        slots = [i for j in range(shares[0]) for i, c in enumerate(shares) if j < c]  # interleaved
        parts: list[list[ScheduledRequest]] = [[] for _ in range(workers)]
        for k, r in enumerate(ordered):
            parts[slots[k % len(slots)]].append(r)
        return [Shard(i, parts[i], shares[i]) for i in range(workers)]
    workers = max(1, min(workers, len(ordered)))
    return [Shard(i, ordered[i::workers], None) for i in range(workers)]


def auto_workers(schedule: list[ScheduledRequest], mode: str, cpus: int | None = None) -> int:
    """How many processes `workers: auto` uses: enough that each streams at most half a
    core's worth of tokens at the schedule's offered token rate, leaving a core to the
    rest of the machine. Closed loop has no offered rate: one."""
    cpus = os.cpu_count() or 1 if cpus is None else cpus
    if mode != "open" or len(schedule) < 2:
        return 1
    span = max(r.t_offset_s for r in schedule) - min(r.t_offset_s for r in schedule)
    rate = sum(r.output_tokens for r in schedule) / max(span, 1.0)
    return max(1, min(max(1, cpus - 1), math.ceil(rate / (TOKENS_PER_CORE_S * _AUTO_SHARE))))


def resolve_workers(workers: int | str, schedule: list[ScheduledRequest], mode: str) -> int:
    if workers == "auto":
        return auto_workers(schedule, mode)
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive number or 'auto', got {workers!r}")
    return workers


def _die_with_parent(parent: int) -> None:
    set_parent_death_signal()
    if os.getppid() != parent:  # the parent died before the kernel was told
        os._exit(1)


def worker_main(conn: Connection, parent: int, one: Shard, base_url: str, settings) -> None:
    """A worker process: its shard, replayed from the start instant the main process sends."""
    _die_with_parent(parent)
    raise_open_file_limit()  # this process sends: its own connections (filledfirst.loadgen.fdlimit)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    settings = dataclasses.replace(settings, workers=1, concurrency=one.concurrency)
    sender = Sender(one.schedule, base_url, settings)
    conn.send(("ready", one.index))
    message = conn.recv()
    if message[0] != "start":
        return
    from filledfirst.loadgen import loop

    loop.run(run_shard(sender, message[1], conn, one.index))
    conn.send(("done", one.index, sender.requests, sender.tokens, sender.client_cpu_s))
    conn.close()



async def run_shard(sender: Sender, t0: float, conn: Connection, index: int) -> None:
    """A worker process's part: send its shard on the main process's clock until its end
    or a stop from the main process."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_message() -> None:
        try:
            _, reason = conn.recv()
        except (EOFError, OSError):
            reason = "the replay's main process went away"
        loop.remove_reader(conn.fileno())
        sender.interrupted = sender.interrupted or reason
        stop.set()

    watch(loop, conn, on_message)
    try:
        async with sender.requests_pool() as conns:  # the main process scrapes
            sender.t0 = t0
            cpu0 = time.process_time()
            finished = asyncio.Event()
            reporter = asyncio.create_task(report_progress(conn, index, sender.requests, finished))
            await sender.send_all(conns, stop)
            sender.t_end = sender.clock()
            sender.client_cpu_s = time.process_time() - cpu0
            finished.set()
            await reporter
    finally:
        if not stop.is_set():
            loop.remove_reader(conn.fileno())


@dataclasses.dataclass(slots=True)
class _Worker:
    shard: Shard
    process: mp.Process
    conn: Connection
    ready: bool = False
    done: bool = False
    progress: tuple[int, int, int, int] = (0, 0, 0, 0)  # sent, done, failed, in flight
    cpu_s: float | None = None
    requests: list[RequestRecord] | None = None
    tokens: object = None


class WorkerPool:
    """The main process's side: start, go, stop, collect."""

    def __init__(self, shards: list[Shard], base_url: str, settings):
        ctx = mp.get_context("spawn")
        self.workers: list[_Worker] = []
        for one in shards:
            parent_end, child_end = ctx.Pipe()
            process = ctx.Process(target=worker_main, args=(child_end, os.getpid(), one, base_url, settings),
                                  name=f"filledfirst-replay-worker-{one.index}", daemon=True)
            self.workers.append(_Worker(one, process, parent_end))
        self._changed: asyncio.Event | None = None
        self._stop_sent = False
        self.lost: list[str] = []

    def __len__(self) -> int:
        return len(self.workers)

    def _on_message(self, w: _Worker) -> None:
        try:
            message = w.conn.recv()
        except (EOFError, OSError):
            asyncio.get_running_loop().remove_reader(w.conn.fileno())
            if not w.done:
                w.done = True
                w.process.join(timeout=1.0)  # gone already: reaped, so its exit code is known
                code = w.process.exitcode
                self.lost.append(f"replay worker {w.shard.index} exited before sending its records"
                                 + (f" (exit code {code})" if code is not None else ""))
                # The run no longer offers the load it was asked to: the others stop too.
                self.stop(self.lost[-1])
            assert self._changed is not None
            self._changed.set()
            return
        kind = message[0]
        if kind == "ready":
            w.ready = True
        elif kind == "progress":
            w.progress = message[2]
        elif kind == "done":
            _, _, w.requests, w.tokens, w.cpu_s = message
            w.done = True
            asyncio.get_running_loop().remove_reader(w.conn.fileno())
        assert self._changed is not None
        self._changed.set()

    async def _until(self, predicate, stop: asyncio.Event | None = None, timeout: float | None = None) -> bool:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        assert self._changed is not None
        while not predicate():
            if stop is not None and stop.is_set():
                return False
            self._changed.clear()
            waits = [asyncio.ensure_future(self._changed.wait())]
            if stop is not None:
                waits.append(asyncio.ensure_future(stop.wait()))
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                for t in waits:
                    t.cancel()
                return False
            await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            for t in waits:
                t.cancel()
        return True

    async def start(self, stop: asyncio.Event) -> bool:
        """Spawn every worker and wait until all are ready (or one died, or a stop)."""
        loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        for w in self.workers:
            w.process.start()
            watch(loop, w.conn, lambda w=w: self._on_message(w))
        if not await self._until(lambda: all(w.ready or w.done for w in self.workers), stop,
                                 timeout=_START_TIMEOUT_S):
            self.lost += [f"replay worker {w.shard.index} was not ready within {_START_TIMEOUT_S:g} s"
                          for w in self.workers if not (w.ready or w.done) and not (stop.is_set())]
            return False
        return not self.lost

    def go(self, t0: float) -> None:
        for w in self.workers:
            if not w.done:
                w.conn.send(("start", t0))

    def stop(self, reason: str) -> None:
        if self._stop_sent:
            return
        self._stop_sent = True
        for w in self.workers:
            if not w.done:
                try:
                    w.conn.send(("stop", reason))
                except (BrokenPipeError, OSError):
                    pass

    async def wait(self, stop: asyncio.Event, reason: Callable[[], str]) -> None:
        """Until every worker sent its records; a stop is passed on to them all, with `reason()`."""
        if not await self._until(lambda: all(w.done for w in self.workers), stop):
            self.stop(reason())
            if not await self._until(lambda: all(w.done for w in self.workers), timeout=_STOP_GRACE_S):
                for w in self.workers:
                    if not w.done:
                        self.lost.append(f"replay worker {w.shard.index} sent no records within "
                                         f"{_STOP_GRACE_S:g} s of the stop")

    def close(self) -> None:
        """Every worker process gone, whatever happened."""
        loop = None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            pass
        for w in self.workers:
            if loop is not None and not w.conn.closed:
                loop.remove_reader(w.conn.fileno())
            if w.process.pid is not None:
                w.process.join(timeout=5 if w.done else 0.1)
                if w.process.is_alive():
                    w.process.kill()
                    w.process.join(timeout=5)
            w.conn.close()

    def progress(self) -> tuple[int, int, int, int]:
        return tuple(sum(w.progress[i] for w in self.workers) for i in range(4))  # type: ignore[return-value]

    def cpu(self) -> list[float | None]:
        return [w.cpu_s for w in self.workers]


def watch(loop: asyncio.AbstractEventLoop, conn: Connection, callback: Callable[[], None]) -> None:
    """Call `callback` when `conn` has a message. uvloop makes a watched descriptor
    non-blocking, and a message of records larger than the pipe's buffer then fails
    halfway (EAGAIN): the pipe stays blocking, and is only read when it is readable."""
    loop.add_reader(conn.fileno(), callback)
    os.set_blocking(conn.fileno(), True)


def progress_counts(requests: list[RequestRecord]) -> tuple[int, int, int, int]:
    """sent, done, failed, in flight: the progress line's counts."""
    sent = sum(1 for r in requests if r.t_sent is not None)
    in_flight = sum(1 for r in requests if r.t_sent is not None and r.t_done is None)
    done = sent - in_flight
    failed = done - sum(1 for r in requests if r.t_done is not None and r.status == "ok")
    return sent, done, failed, in_flight


async def report_progress(conn: Connection, index: int, requests: list[RequestRecord], done: asyncio.Event) -> None:
    while not done.is_set():
        try:
            conn.send(("progress", index, progress_counts(requests)))
        except (BrokenPipeError, OSError):
            return
        try:
            await asyncio.wait_for(done.wait(), timeout=PROGRESS_EVERY_S)
        except asyncio.TimeoutError:
            pass
