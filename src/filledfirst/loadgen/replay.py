"""Replay a schedule: open loop (each request leaves at its scheduled time, whatever the
server does) or closed loop (N workers, each sends the next request when its last ends),
in this process or split across worker processes (filledfirst.loadgen.workers), with the
/metrics scraper beside it. The sending itself is filledfirst.loadgen.sender's."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from typing import Any, AsyncIterator, Callable

import aiohttp

from filledfirst.contracts.records import ScheduledRequest
from filledfirst.interrupts import note_interrupt, signal_reason
from filledfirst.loadgen.fdlimit import raise_open_file_limit
from filledfirst.loadgen.http1 import Pool
from filledfirst.loadgen.progress import show_progress
from filledfirst.loadgen.scrape import Scraper
from filledfirst.loadgen.sender import Sender
from filledfirst.loadgen.settings import ReplaySettings
from filledfirst.loadgen.workers import WorkerPool, progress_counts, resolve_workers, shard

log = logging.getLogger(__name__)

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _OfSender:
    """An attribute of the replay that is its sender's."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, replay: Replay, owner: type | None = None) -> Any:
        return getattr(replay.sender, self.name)

    def __set__(self, replay: Replay, value: Any) -> None:
        setattr(replay.sender, self.name, value)


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
        self.workers = resolve_workers(settings.workers, schedule, settings.mode)
        self.sender = Sender(schedule, base_url, settings, bodies=self.workers == 1)
        self.settings = settings
        self.requests, self.tokens = self.sender.requests, self.sender.tokens
        self.scraper = Scraper(base_url + "/metrics", settings.scrape_interval_s, self.clock)
        self.progress = progress
        self.server_alive = server_alive
        self.server_died = False
        self.client_cpu_peak_s: float | None = None  # the busiest process's share of it
        self._scrapes: aiohttp.ClientSession | None = None  # set while running
        self._pool: WorkerPool | None = None

    # What ended the run, its end and the client's CPU: the sender's, whichever process sent.
    interrupted = _OfSender()
    t_end = _OfSender()
    client_cpu_s = _OfSender()
    deadline_s = _OfSender()

    def clock(self) -> float:
        return self.sender.clock()

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
            self.sender.requests_pool() as pool,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True),
                                  headers=self.sender.headers) as scrapes,
        ):
            self._scrapes = scrapes
            yield pool

    async def _run(self, stop: asyncio.Event) -> None:
        async with self._sessions() as conns:
            pool = None
            if self.workers > 1:
                shards = shard(self.sender.schedule, self.workers, self.settings.mode, self.settings.concurrency)
                pool = self._pool = WorkerPool(shards, self.sender.base_url, self.settings)
            try:
                if pool is not None and not await pool.start(stop):
                    self.interrupted = self.interrupted or "; ".join(pool.lost) or "stopped"
                    pool.stop(self.interrupted)
                    return
                self.sender.t0 = time.perf_counter()
                cpu0 = time.process_time()
                if pool is not None:
                    pool.go(self.sender.t0)
                scrape_stop = asyncio.Event()
                assert self._scrapes is not None
                background = [asyncio.create_task(self.scraper.run(self._scrapes, scrape_stop))]
                if self.progress:
                    background.append(asyncio.create_task(show_progress(self.status_line, scrape_stop)))
                if self.server_alive is not None:
                    background.append(asyncio.create_task(self._watch_server(stop, scrape_stop)))
                if pool is None:
                    await self.sender.send_all(conns, stop)
                else:
                    await pool.wait(stop, lambda: self.interrupted or "stopped")
                    self._merge(pool)
                self.sender.t_end = self.clock()
                own = time.process_time() - cpu0
                workers = [c for c in (pool.cpu() if pool is not None else []) if c is not None]
                self.sender.client_cpu_s = own + sum(workers)
                self.client_cpu_peak_s = max([own, *workers])
                scrape_stop.set()
                for result in await asyncio.gather(*background, return_exceptions=True):
                    if isinstance(result, Exception):
                        log.error("a background task of the replay failed: %r", result)
            finally:
                if pool is not None:
                    pool.close()

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

