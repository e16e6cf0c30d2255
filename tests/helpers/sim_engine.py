"""A simulated engine with a known step-time law and known limits, scheduled as vLLM's
V1 scheduler does: every step first the running requests (a decode token each, or their
prompt's next chunk), then the waiting ones in order while the cap has a slot, the step's
token budget has room and the KV cache has the blocks of the chunk (the first that does
not fit stops admission); a running request that needs a block none is free for preempts
the newest. Poisson arrivals; `speed(t)` divides the step time (a machine that wanders).

`knee` searches the simulated rate at which a share `target` of the requests stops
meeting the SLO (TTFT and the longest gap between tokens), the knee a capacity search
would find on it."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np


@dataclass
class Engine:
    law: tuple[float, float, float]  # ms a step, ms a token in it, ms a sequence running
    cap: int
    kv_tokens: int
    budget: int
    block: int = 16
    speed: Callable[[float], float] = lambda t: 1.0


@dataclass
class _Req:
    arrival: float
    prompt: int
    output: int
    done_prompt: int = 0
    generated: int = 0
    blocks: int = 0
    first: float | None = None
    last: float | None = None
    max_gap: float = 0.0
    finished: float | None = None
    order: int = field(default=0)


def run(engine: Engine, rate: float, prompts: np.ndarray, outputs: np.ndarray, seed: int = 0,
        start: float = 0.0, concurrency: int | None = None, steps: list | None = None) -> list[_Req]:
    """Every request's fate at `rate` requests/s (times in s, from `start` on the engine's
    clock), or, given `concurrency`, in a closed loop of that many (`rate` unused: a request
    arrives as one ends). `steps`, if given, gets (time, running, waiting, KV tokens held)
    after every step."""
    rng = np.random.default_rng(seed)
    arrivals = (np.full(len(prompts), start) if concurrency is not None
                else start + np.cumsum(rng.exponential(1 / rate, len(prompts))))
    reqs = [_Req(float(a), int(p), int(o), order=i) for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs))]
    pending = deque(reqs)
    waiting: deque[_Req] = deque()
    running: list[_Req] = []
    free = engine.kv_tokens // engine.block
    t = start
    left = len(reqs)
    base, per_token, per_seq = engine.law
    while left:
        if not running and not waiting:
            t = max(t, pending[0].arrival)
        while pending and (pending[0].arrival <= t if concurrency is None
                           else len(running) + len(waiting) < concurrency):
            r = pending.popleft()
            if concurrency is not None:
                r.arrival = t
            waiting.append(r)
        tokens = 0
        work: list[tuple[_Req, int]] = []
        for r in list(running):
            if r not in running:  # preempted this step
                continue
            n = min(r.prompt - r.done_prompt, engine.budget - tokens) if r.done_prompt < r.prompt else 1
            if n <= 0:
                continue
            need = math.ceil((r.done_prompt + r.generated + n) / engine.block) - r.blocks
            while need > free and running[-1] is not r:
                victim = running.pop()  # the newest gives its blocks back and starts over
                work = [(w, k) for w, k in work if w is not victim]
                tokens = sum(k for _, k in work)
                free += victim.blocks
                victim.blocks = victim.done_prompt = victim.generated = 0
                victim.first = victim.last = None
                victim.max_gap = 0.0
                waiting.appendleft(victim)
            if need > free:
                continue
            free -= need
            r.blocks += need
            work.append((r, n))
            tokens += n
        while waiting and len(running) < engine.cap and tokens < engine.budget:
            r = waiting[0]
            n = min(r.prompt, engine.budget - tokens)
            need = math.ceil(n / engine.block)
            if need > free:
                break
            waiting.popleft()
            free -= need
            r.blocks = need
            running.append(r)
            work.append((r, n))
            tokens += n
        if not work:
            t = pending[0].arrival if pending else t + base / 1000
            continue
        t += (base + per_token * tokens + per_seq * len(running)) / 1000 / engine.speed(t)
        if steps is not None:
            steps.append((t, len(running), len(waiting), sum(r.blocks for r in running) * engine.block))
        for r, n in work:
            if r.done_prompt < r.prompt:
                r.done_prompt += n
                if r.done_prompt < r.prompt:
                    continue
            r.generated += 1
            if r.first is None:
                r.first = t
            else:
                r.max_gap = max(r.max_gap, t - (r.last or t))
            r.last = t
            if r.generated >= r.output:
                r.finished = t
                running.remove(r)
                free += r.blocks
                left -= 1
    return reqs


def attainment(reqs: list[_Req], ttft_s: float, itl_s: float) -> float:
    met = [r.first is not None and r.first - r.arrival <= ttft_s and r.max_gap <= itl_s for r in reqs]
    return sum(met) / len(met)


def knee(engine: Engine, prompts: np.ndarray, outputs: np.ndarray, ttft_s: float, itl_s: float,
         target: float, lo: float, hi: float, seed: int = 0) -> float:
    """The rate between lo (held) and hi (broke) where attainment crosses `target`, to 1 %."""
    while hi / lo > 1.01:
        mid = math.sqrt(lo * hi)
        ok = attainment(run(engine, mid, prompts, outputs, seed), ttft_s, itl_s) >= target
        lo, hi = (mid, hi) if ok else (lo, mid)
    return math.sqrt(lo * hi)
