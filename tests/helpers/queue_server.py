"""A simulated server for the capacity search: `slots` requests served at once, first come
first served, each for a lifetime drawn around `life_s` (lognormal, `cv`), so its
capacity is slots / life_s requests per second. A probe is an open loop from an idle
server at a constant rate; a request's wait for its first token is its queueing plus
`prefill_s`. No clock, no process: the search's rule against a queue whose capacity is
known."""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass

from filledfirst.frontier.search import ProbeOutcome
from filledfirst.frontier.verdict import backlog_growth


@dataclass(frozen=True)
class QueueServer:
    slots: int = 16
    life_s: float = 2.0
    cv: float = 0.1
    prefill_s: float = 0.05
    slo_ttft_s: float = 3.0

    @property
    def capacity(self) -> float:
        return self.slots / self.life_s

    def _life(self, rng: random.Random) -> float:
        sigma = math.sqrt(math.log(1 + self.cv ** 2))
        return self.life_s * math.exp(rng.gauss(-sigma * sigma / 2, sigma))

    def waits(self, arrivals: list[float], rng: random.Random) -> list[float]:
        free = [0.0] * self.slots
        out = []
        for a in arrivals:
            start = max(a, heapq.heappop(free))
            out.append(start - a + self.prefill_s)
            heapq.heappush(free, start + self._life(rng))
        return out

    def probe(self, rate: float, probe_s: float, seed: int) -> ProbeOutcome:
        """An open-loop probe of `probe_s` seconds at `rate`, as the runner reports it."""
        rng = random.Random(seed)
        arrivals = [i / rate for i in range(max(1, round(rate * probe_s)))]
        waits = self.waits(arrivals, rng)
        met = sum(w <= self.slo_ttft_s for w in waits)
        return ProbeOutcome(rate, met / len(waits), requests=len(waits), growth=backlog_growth(arrivals, waits))

    def closed_loop(self, batches: int, seed: int) -> float:
        """Completions per second of a closed loop of `slots` after its first batch (the
        runner's capacity estimate)."""
        rng = random.Random(seed)
        free = [0.0] * self.slots
        done = []
        for _ in range(batches * self.slots):
            start = heapq.heappop(free)
            end = start + self._life(rng)
            done.append(end)
            heapq.heappush(free, end)
        done.sort()
        return (len(done) - self.slots) / (done[-1] - done[self.slots - 1])
