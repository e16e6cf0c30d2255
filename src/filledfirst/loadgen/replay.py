"""Replay a schedule: open loop (each request leaves at its scheduled time, whatever the
server does) or closed loop (N workers, each sends the next request when its last ends),
in this process or split across worker processes (filledfirst.loadgen.workers)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from multiprocessing.connection import Connection
from typing import Any, AsyncIterator, Callable, Coroutine

import aiohttp

from filledfirst.contracts.records import RecordColumns, RequestRecord, ScheduledRequest, TokenRecord
from filledfirst.deadline import run_deadline_s
from filledfirst.interrupts import note_interrupt, signal_reason
from filledfirst.loadgen.fdlimit import raise_open_file_limit
from filledfirst.loadgen.http1 import Pool, Target
from filledfirst.loadgen.progress import show_progress
from filledfirst.loadgen.prompts import completion_body, endpoint
from filledfirst.loadgen.scrape import Scraper
from filledfirst.loadgen.settings import ReplaySettings
from filledfirst.loadgen.stream import DEADLINE_PASSED, send_streamed
from filledfirst.loadgen.workers import WorkerPool, progress_counts, report_progress, resolve_workers, shard, watch

log = logging.getLogger(__name__)

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Replay:
    """Holds every record from the start, so whatever ends the run, nothing measured is lost."""

    def __init__(
        self,
        schedule: list[ScheduledRequest],
        base_url: str,
        settings: ReplaySettings,
        *,
        progress: bool = True,
        server_alive: Callable[[], bool] | None = None,
    ):
        if settings.mode not in ("open", "closed") or (settings.mode == "closed" and not settings.concurrency):
            raise ValueError(f"mode {settings.mode!r} (closed needs a concurrency), got {settings.concurrency!r}")
        self.mode = settings.mode
        self.concurrency = settings.concurrency
        self.schedule = sorted(schedule, key=lambda r: (r.t_offset_s, r.request_id))
        self.base_url, self.settings = base_url, settings
        self.workers = resolve_workers(settings.workers, self.schedule, self.mode)
        self.url = base_url + endpoint(settings.api)
        # Bodies are built before the clock starts so building them never delays a send.
        # With worker processes, each builds its own shard's.
        self.bodies = {
            r.request_id: completion_body(
                r, model=settings.model, low=settings.token_low, high=settings.token_high, seed=settings.seed,
                api=settings.api, prompt=settings.prompt,
            )
            for r in self.schedule
        } if self.workers == 1 else {}
        self.requests = [
            RequestRecord(r.request_id, r.role, r.prompt_tokens, r.output_tokens, r.t_offset_s, status="not_sent")
            for r in self.schedule
        ]
        self.tokens = RecordColumns(TokenRecord)  # one row per streamed chunk: compact
        self.target = Target.parse(self.url)  # a malformed URL fails here, before anything starts
        self.first_token_timeout_s = settings.first_token_timeout_s
        # The one deadline of the run, on its clock (filledfirst.deadline); a
        # worker process's is its shard's, never later than the whole run's.
        self.deadline_s = run_deadline_s(
            self.mode, len(self.schedule), self.concurrency, self.schedule[-1].t_offset_s if self.schedule else 0.0,
            settings.request_timeout_s, settings.drain_timeout_s)
        self._t0 = 0.0
        self._scrapes: aiohttp.ClientSession | None = None  # set while running
        self.scraper = Scraper(base_url + "/metrics", settings.scrape_interval_s, self.clock)
        self.progress = progress
        self.server_alive = server_alive
        self._headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        self.interrupted: str | None = None
        self.server_died = False
        self.t_end: float | None = None
        self.client_cpu_s: float | None = None  # to tell a starved client from a slow server
        self.client_cpu_peak_s: float | None = None  # the busiest process's share of it
        self._pool: WorkerPool | None = None

    def clock(self) -> float:
        return time.perf_counter() - self._t0

    def status_line(self) -> str:
        pool = self._pool
        sent, done, failed, in_flight = pool.progress() if pool is not None else progress_counts(self.requests)
        g = self.scraper.latest
        server = str(g) if g is not None else "server: no scrape yet"
        workers = f"  ({len(pool)} workers)" if pool is not None else ""
        return (
            f"t={self.clock():6.1f}s  sent {sent}/{len(self.requests)}  done {done}  failed {failed}  "
            f"in flight {in_flight}{workers}  |  {server}"
        )

    async def run(self) -> None:
        raise_open_file_limit()  # a connection per request in flight (filledfirst.loadgen.fdlimit)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def on_signal(sig: signal.Signals) -> None:
            reason = signal_reason(sig)
            note_interrupt(reason)
            self.interrupted = self.interrupted or reason
            stop.set()

        previous = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}
        for sig in _STOP_SIGNALS:
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            await self._run(stop)
        finally:
            for sig in _STOP_SIGNALS:
                loop.remove_signal_handler(sig)
                signal.signal(sig, previous[sig])  # asyncio would leave the default action

    @contextlib.asynccontextmanager
    async def _sessions(self) -> AsyncIterator[Pool]:
        # The requests: keep-alive connections, no cap on how many (opening one per request
        # delayed arrivals by seconds at 200 req/s); a request whose pooled connection the
        # server closed meanwhile is sent once more on a fresh one (filledfirst.loadgen.http1).
        # The scraper: aiohttp, a fresh connection per scrape.
        async with (
            self._requests_pool() as pool,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True),
                                  headers=self._headers) as scrapes,
        ):
            self._scrapes = scrapes
            yield pool

    def _requests_pool(self) -> Pool:
        return Pool(self.target, self._headers, connect_timeout_s=self.settings.connect_timeout_s)

    async def _run(self, stop: asyncio.Event) -> None:
        async with self._sessions() as conns:
            pool = None
            if self.workers > 1:
                pool = self._pool = WorkerPool(shard(self.schedule, self.workers, self.mode, self.concurrency),
                                               self.base_url, self.settings)
            try:
                if pool is not None and not await pool.start(stop):
                    self.interrupted = self.interrupted or "; ".join(pool.lost) or "stopped"
                    pool.stop(self.interrupted)
                    return
                self._t0 = time.perf_counter()
                cpu0 = time.process_time()
                if pool is not None:
                    pool.go(self._t0)
                scrape_stop = asyncio.Event()
                assert self._scrapes is not None
                background = [asyncio.create_task(self.scraper.run(self._scrapes, scrape_stop))]
                if self.progress:
                    background.append(asyncio.create_task(show_progress(self.status_line, scrape_stop)))
                if self.server_alive is not None:
                    background.append(asyncio.create_task(self._watch_server(stop, scrape_stop)))
                if pool is None:
                    await self._send_all(conns, stop)
                else:
                    await pool.wait(stop, lambda: self.interrupted or "stopped")
                    self._merge(pool)
                self.t_end = self.clock()
                own = time.process_time() - cpu0
                workers = [c for c in (pool.cpu() if pool is not None else []) if c is not None]
                self.client_cpu_s = own + sum(workers)
                self.client_cpu_peak_s = max([own, *workers])
                scrape_stop.set()
                for result in await asyncio.gather(*background, return_exceptions=True):
                    if isinstance(result, Exception):
                        log.error("a background task of the replay failed: %r", result)
            finally:
                if pool is not None:
                    pool.close()

    async def _send_all(self, conns: Pool, stop: asyncio.Event) -> None:
        """Send the schedule (open or closed loop) until it is done, a stop or the deadline;
        cancel what is still open."""
        if self.mode == "open":
            tasks = await self._dispatch(conns, stop)
        else:
            tasks = self._closed_loop(conns, stop)
        await self._until_deadline(tasks, stop)
        still = [t for t in tasks if not t.done()]
        for t in still:
            t.cancel(self.interrupted or DEADLINE_PASSED)
        await asyncio.gather(*still, return_exceptions=True)
        if not self.interrupted:
            for rec in self.requests:
                if rec.status == "not_sent" and rec.error is None:
                    rec.error = f"not sent: {DEADLINE_PASSED} ({self.deadline_s:g} s after the start)"

    def _merge(self, pool: WorkerPool) -> None:
        """The workers' records in place of this process's (all `not_sent` until now)."""
        where = {r.request_id: i for i, r in enumerate(self.requests)}
        for w in pool.workers:
            if w.requests is None:
                for s in w.shard.schedule:
                    self.requests[where[s.request_id]].error = (
                        f"replay worker {w.shard.index} lost its records")
                continue
            for rec in w.requests:
                self.requests[where[rec.request_id]] = rec
            self.tokens.extend(w.tokens)
        if pool.lost:
            self.interrupted = self.interrupted or "; ".join(pool.lost)

    async def run_shard(self, t0: float, conn: Connection, index: int) -> None:
        """A worker process's part (filledfirst.loadgen.workers): send this replay's
        schedule on the main process's clock until its end or a stop from the main process."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def on_message() -> None:
            try:
                _, reason = conn.recv()
            except (EOFError, OSError):
                reason = "the replay's main process went away"
            loop.remove_reader(conn.fileno())
            self.interrupted = self.interrupted or reason
            stop.set()

        watch(loop, conn, on_message)
        try:
            async with self._requests_pool() as conns:  # the main process scrapes
                self._t0 = t0
                cpu0 = time.process_time()
                finished = asyncio.Event()
                reporter = asyncio.create_task(report_progress(conn, index, self.requests, finished))
                await self._send_all(conns, stop)
                self.t_end = self.clock()
                self.client_cpu_s = time.process_time() - cpu0
                finished.set()
                await reporter
        finally:
            if not stop.is_set():
                loop.remove_reader(conn.fileno())

    async def _watch_server(self, stop: asyncio.Event, done: asyncio.Event) -> None:
        """A dead server ends the run at once instead of after the whole schedule."""
        while not done.is_set():
            if not self.server_alive():
                self.server_died = True
                self.interrupted = self.interrupted or "vLLM exited during the run"
                stop.set()
                return
            try:
                await asyncio.wait_for(done.wait(), timeout=0.5)
            except asyncio.TimeoutError:
                pass

    async def _until_deadline(self, tasks: list[asyncio.Task], stop: asyncio.Event) -> None:
        """Wait for the tasks until all end, a stop signal, or the run's deadline."""
        waiter = asyncio.create_task(stop.wait())
        pending = {t for t in tasks if not t.done()}
        while pending and not stop.is_set() and (left := self.deadline_s - self.clock()) > 0:
            _, pending = await asyncio.wait(pending | {waiter}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            pending.discard(waiter)
        waiter.cancel()

    def _send(self, conns: Pool, rec: RequestRecord) -> Coroutine[Any, Any, None]:
        """One request, sent and streamed into its record (open and closed loop alike)."""
        return send_streamed(conns, self.bodies[rec.request_id], rec, self.tokens, self.clock,
                             self.settings.request_timeout_s, self.first_token_timeout_s)

    def _closed_loop(self, conns: Pool, stop: asyncio.Event) -> list[asyncio.Task]:
        """Workers share one iterator over the schedule; a request's `t_scheduled` becomes
        the moment a worker took it, as a closed loop has no arrival times of its own."""
        pending = iter(self.requests)

        async def worker() -> None:
            for rec in pending:
                if stop.is_set():
                    return
                rec.t_scheduled = self.clock()
                rec.status = "ok"
                await self._send(conns, rec)

        return [asyncio.create_task(worker()) for _ in range(self.concurrency)]

    async def _dispatch(self, conns: Pool, stop: asyncio.Event) -> list[asyncio.Task]:
        tasks = []
        # One waiter on `stop` for the whole schedule: a wait_for per request made a task
        # per request, and its timeout took two more turns of the loop, each as long as the
        # reads that share it; under load that was the dispatch lag's tail.
        stopped = asyncio.ensure_future(stop.wait())
        try:
            for sched, rec in zip(self.schedule, self.requests):
                # A loop, not one wait: uvloop's timers tick in whole milliseconds and can
                # wake a little early; a request never leaves before its scheduled time.
                while (delay := sched.t_offset_s - self.clock()) > 0 and not stop.is_set():
                    await asyncio.wait((stopped,), timeout=delay)
                if stop.is_set():
                    break
                rec.status = "ok"
                tasks.append(asyncio.create_task(self._send(conns, rec)))
        finally:
            stopped.cancel()
        return tasks
