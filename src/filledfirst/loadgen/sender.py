"""One process's sending: a schedule's request records, their bodies and the run's one
deadline, sent open or closed loop on a shared clock. The replay (filledfirst.loadgen.replay)
builds one for the whole schedule in this process, a worker process
(filledfirst.loadgen.workers) one for its shard."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Coroutine

from filledfirst.contracts.records import RecordColumns, RequestRecord, ScheduledRequest, TokenRecord
from filledfirst.deadline import run_deadline_s
from filledfirst.loadgen.http1 import Pool, Target
from filledfirst.loadgen.prompts import completion_body, endpoint
from filledfirst.loadgen.settings import ReplaySettings
from filledfirst.loadgen.stream import DEADLINE_PASSED, send_streamed


class Sender:
    """Holds every record from the start, so whatever ends the run, nothing measured is lost."""

    def __init__(self, schedule: list[ScheduledRequest], base_url: str, settings: ReplaySettings, *,
                 bodies: bool = True):
        if settings.mode not in ("open", "closed") or (settings.mode == "closed" and not settings.concurrency):
            raise ValueError(f"mode {settings.mode!r} (closed needs a concurrency), got {settings.concurrency!r}")
        self.mode = settings.mode
        self.concurrency = settings.concurrency
        self.schedule = sorted(schedule, key=lambda r: (r.t_offset_s, r.request_id))
        self.base_url, self.settings = base_url, settings
        self.url = base_url + endpoint(settings.api)
        # Bodies are built before the clock starts so building them never delays a send.
        # A replay split over worker processes builds none: each worker builds its shard's.
        self.bodies = {
            r.request_id: completion_body(
                r, model=settings.model, low=settings.token_low, high=settings.token_high, seed=settings.seed,
                api=settings.api, prompt=settings.prompt, cache_salt=settings.cache_salt,
            )
            for r in self.schedule
        } if bodies else {}
        self.requests = [
            RequestRecord(r.request_id, r.role, r.prompt_tokens, r.output_tokens, r.t_offset_s, status="not_sent",
                          ideal_cached_tokens=r.ideal_cached_tokens if r.block_tokens else None)
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
        self.headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        self.t0 = 0.0  # the run's clock zero (perf_counter), set when sending starts
        self.interrupted: str | None = None
        self.t_end: float | None = None
        self.client_cpu_s: float | None = None  # to tell a starved client from a slow server

    def clock(self) -> float:
        return time.perf_counter() - self.t0

    def requests_pool(self) -> Pool:
        return Pool(self.target, self.headers, connect_timeout_s=self.settings.connect_timeout_s)

    async def send_all(self, conns: Pool, stop: asyncio.Event) -> None:
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
