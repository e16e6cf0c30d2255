"""Poll the server's /metrics on the run's clock and keep every vLLM sample."""

from __future__ import annotations

import asyncio
import math
import random
import time
from typing import Callable

import aiohttp

from filledfirst.contracts.gauges import Gauges
from filledfirst.contracts.records import RecordColumns, SampleRecord
from filledfirst.metrics import SCRAPE_ERROR, SCRAPE_SECONDS, latest_gauges, parse_metrics

# Where in its slot each scrape falls: a seeded uniform point in the first half, so the
# gap between scrapes stays within 0.5-1.5 intervals (a value holds for at most
# diagnosis.scrape_hold_factor intervals: 2 by default).
_PHASE_SEED = 0
_PHASE_SPREAD = 0.5

class Scraper:
    def __init__(self, url: str, interval_s: float, clock: Callable[[], float]):
        self.url = url
        self.interval_s = interval_s
        self.clock = clock
        self.samples = RecordColumns(SampleRecord)
        self.latest: Gauges | None = None
        self.errors = 0

    async def scrape_once(self, session: aiohttp.ClientSession) -> None:
        """One scrape. Whatever goes wrong in it (except a cancellation) fails this scrape
        alone, counted and named by its exception's type: the next one is taken as usual."""
        t = self.clock()  # a failed scrape: what it did not see began when it asked
        started = time.perf_counter()
        try:
            timeout = aiohttp.ClientTimeout(total=max(self.interval_s * 4, 2.0))
            async with session.get(self.url, timeout=timeout) as resp:
                # The page is rendered before its headers go out: the values are the
                # server's at its answer, which a slow scrape reaches long after asking.
                t = self.clock()
                body = await resp.read()
                if resp.status != 200:
                    raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status,
                                                      message=body[:200].decode(errors="replace"))
        except Exception as exc:
            return self._failed(t, type(exc).__name__)
        try:
            # Prometheus' text format is UTF-8, whatever the headers say, and vLLM's
            # prometheus_client writes nothing else: a page that is not was damaged on its
            # way, so none of its values is trusted (strict, not errors="replace").
            batch = parse_metrics(body.decode("utf-8"), t)
        except Exception as exc:
            return self._failed(t, f"parse:{type(exc).__name__}")
        self.samples.extend(batch)
        self.samples.append(SampleRecord(t, SCRAPE_SECONDS, "", time.perf_counter() - started))
        self.latest = latest_gauges(batch)

    def _failed(self, t: float, what: str) -> None:
        """A failed scrape is a sample too, so gaps in the server's series are explained."""
        self.errors += 1
        self.samples.append(SampleRecord(t, SCRAPE_ERROR, f"error={what}", 1.0))

    async def run(self, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        """Scrape once per slot of a fixed grid (no drift) until `stop`, then once more for
        the final counters. Each scrape falls at a random point in the first half of its
        slot (seeded: the same points every run): on a grid as exact as the arrivals'
        (requests every 0.25 s, scrapes every 0.25 s from the same start, uvloop's timers
        on the millisecond) every scrape fell just before an arrival, and a server that
        finished each request within the gap was seen running 0 in all 25 scrapes of a
        run. Slots a slow scrape overran are skipped: catching up would fire scrapes back
        to back and weigh one instant several times."""
        jitter = random.Random(_PHASE_SEED)
        n = 0
        start = self.clock()
        while not stop.is_set():
            await self.scrape_once(session)
            n = max(n + 1, math.floor((self.clock() - start) / self.interval_s) + 1)
            delay = start + (n + _PHASE_SPREAD * jitter.random()) * self.interval_s - self.clock()
            try:
                await asyncio.wait_for(stop.wait(), timeout=max(delay, 0))
            except asyncio.TimeoutError:
                pass
        await self.scrape_once(session)
