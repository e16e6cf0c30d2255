"""The scheduler's state at every scrape, per engine, and what bound it: the constraint
that kept a waiting request out, read in the order vLLM's scheduler checks it
(docs/diagnosis.md, "What bound a scrape").

From the engine's samples (filledfirst.metrics.scheduler_state_sql): running, waiting,
KV used and the counters. From the requests' server timings: who was waiting at the
scrape, and which of them was queued first (the head of the queue: vLLM admits in
arrival order and stops at the first request it cannot admit) with the blocks its prompt
needs. Then, where a request waited, the first of:

1. preemption: the engine preempted a running request since the last scrape (a decoding
   request needed a block and none was free: its blocks went back to the pool, it went
   back to the queue);
2. cap: running at the cap in effect, exactly;
3. KV blocks: the head's prompt needs more blocks than are free;
4. token budget: the steps up to the next scrape carried (on average) nearly the whole
   per-step token budget;
5. compute: none of these, so the request waited for the step in flight: the engine's
   step time is the limit.

A run's constraint is the one that held while most requests waited, weighted by the
waiting requests and the time each state held (request-seconds of waiting), not by the
run's wall time (`Bindings`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import duckdb
import numpy as np
import polars as pl

from filledfirst import metrics, request_metrics
from filledfirst.analysis import request_path, signals
from filledfirst.contracts.scheduler import Constraint, SchedulerState
from filledfirst.store.tables import replace_table, table_exists
from filledfirst.study import DiagnosisRules

# The requests the server timed: when vLLM queued each (on our clock: the scheduling
# placed by the first token, less the queue) and first scheduled it, and the prompt tokens
# it had to find blocks for (those its prefix cache served are blocks it already had).
_TIMED = f"""
SELECT run_id, request_id, prompt_tokens - coalesce(cached_tokens, 0) AS prompt_tokens,
       t_prefill_start - queue_ms / 1000 AS t_queued,
       t_prefill_start AS t_admitted, t_first_token
FROM ({request_path.REQUEST_PARTS})
WHERE timed AND status = '{request_metrics.OK}'
"""


@dataclass(frozen=True)
class RunLimits:
    """What a run's engines ran with, as the window knows it (filledfirst.analysis.diagnosis.window)."""

    cap: int | None  # per engine
    budget: int | None
    hold: float  # how long a scrape's value stands for, at most


def states(con: duckdb.DuckDBPyConnection, limits: dict[str, RunLimits], rules: DiagnosisRules) -> list[SchedulerState]:
    """Every run's states, ordered by run, engine and time."""
    raw = signals.query(con, metrics.scheduler_state_sql(signals.SAMPLES)).sort("run_id", "engine", "t")
    timed = signals.query(con, _TIMED)
    engines = dict(raw.group_by("run_id").agg(pl.col("engine").n_unique()).iter_rows())
    out: list[SchedulerState] = []
    for (run_id, engine), rows in raw.group_by("run_id", "engine", maintain_order=True):
        run_limits = limits.get(str(run_id))
        if run_limits is None:
            continue
        requests = timed.filter(pl.col("run_id") == run_id)
        # a data-parallel server's cache settings carry every engine's blocks, on each engine's series
        rows = rows.with_columns(pl.col("blocks") // engines[run_id])
        out.extend(_engine_states(str(run_id), str(engine), rows, requests, run_limits, rules, engines[run_id]))
    return out


def _increase(values: np.ndarray, forward: bool) -> np.ndarray:
    """A counter's increase to the next scrape (forward) or from the previous one, as
    Prometheus counts it (a drop is a restart from 0); NaN at the end without a neighbour."""
    if forward:
        d = np.append(values[1:], np.nan)
        base = values
    else:
        d = values
        base = np.insert(values[:-1], 0, np.nan)
    rise = d - base
    return np.where(rise < 0, d, rise)


def _engine_states(run_id: str, engine: str, rows: pl.DataFrame, requests: pl.DataFrame, limits: RunLimits,
                   rules: DiagnosisRules, engines: int) -> Iterable[SchedulerState]:
    col = {name: rows[name].cast(pl.Float64).fill_null(np.nan).to_numpy() for name in (
        "t", "running", "waiting", "kv_used", "preemptions", "steps", "step_tokens", "prompt_tokens", "generated")}
    t = col["t"]
    preempted = _increase(col["preemptions"], forward=False)
    steps = _increase(col["steps"], forward=True)
    step_tokens = _increase(col["step_tokens"], forward=True)
    prompt = _increase(col["prompt_tokens"], forward=True)
    generated = _increase(col["generated"], forward=True)
    if not requests.is_empty() and np.isfinite(generated[:-1]).all():
        # vLLM counts a prompt's tokens at its first token, all at once; its server timings
        # say when it was computed: spread over its prefill, the steps' tokens follow the work
        prompt = _spread(t, requests, requests["prompt_tokens"].to_numpy().astype(float)) / engines
        step_tokens = generated + prompt
        if limits.budget:
            # the step histogram misses the steps that produced no output (only prefill chunks,
            # no decode); a prompt is cut only where a step's budget runs out, so a prompt of p
            # tokens took ceil(p / budget) - 1 full steps before the one that gave its first
            # token. Steps with a decode in them are in the histogram too: the larger count
            # stands (a lower bound of the steps taken)
            chunks = np.maximum(np.ceil(requests["prompt_tokens"].to_numpy() / limits.budget) - 1, 0)
            steps = np.fmax(steps, _spread(t, requests, chunks) / engines)
    dt = np.append(t[1:] - t[:-1], np.nan)
    heads = _heads(t, requests)
    blocks_all, sizes = rows["blocks"].to_list(), rows["block_size"].to_list()
    for i in range(len(t)):
        blocks, size = blocks_all[i], sizes[i]
        kv = _num(col["kv_used"][i])
        # vLLM's usage is 1 - free / (blocks - 1): one block is its null block
        free = None if blocks is None or kv is None else int(round((blocks - 1) * (1 - kv)))
        head_id, head_tokens, head_wait = heads[i]
        head_blocks = math.ceil(head_tokens / size) if head_tokens is not None and size else None
        n_steps = _num(steps[i])
        state = dict(
            run_id=run_id, t=float(t[i]), engine=engine, running=_num(col["running"][i]),
            waiting=_num(col["waiting"][i]), cap=limits.cap, kv_pct=None if kv is None else kv * 100,
            blocks=blocks, blocks_free=free, block_size=size, budget=limits.budget, preempted=_num(preempted[i]),
            steps=n_steps, step_tokens=_num(step_tokens[i]), prompt_tokens=_num(prompt[i]),
            step_ms=_num(dt[i]) * 1000 / n_steps if n_steps and _num(dt[i]) is not None else None,
            head_request=head_id, head_blocks=head_blocks, head_wait_s=head_wait)
        yield SchedulerState(**state, constraint=bind(SchedulerState(**state, constraint=None), rules))


def _spread(t: np.ndarray, requests: pl.DataFrame, amounts: np.ndarray) -> np.ndarray:
    """Per scrape, the part of each timed request's amount (its computed prompt tokens, its
    prefill chunks) that fell from it to the next, the amount spread evenly over the
    request's prefill (scheduled to first token)."""
    start, end = requests["t_admitted"].to_numpy(), requests["t_first_token"].to_numpy()
    lo, hi = t[:, None], np.append(t[1:], np.nan)[:, None]
    overlap = np.clip(np.minimum(hi, end[None, :]) - np.maximum(lo, start[None, :]), 0, None)
    length = np.maximum(end - start, 1e-9)[None, :]
    out = (overlap / length * amounts[None, :]).sum(axis=1)
    out[-1] = np.nan  # no next scrape
    return out


def _num(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _heads(t: np.ndarray, requests: pl.DataFrame) -> list[tuple[int | None, int | None, float | None]]:
    """Per scrape: the request queued first among those waiting (queued, not yet
    scheduled), its prompt tokens and how long it had waited; Nones where the server
    timed no request waiting then."""
    if requests.is_empty():
        return [(None, None, None)] * len(t)
    queued = requests["t_queued"].to_numpy()
    admitted = requests["t_admitted"].to_numpy()
    ids, prompts = requests["request_id"].to_numpy(), requests["prompt_tokens"].to_numpy()
    waiting = (queued[None, :] <= t[:, None]) & (t[:, None] < admitted[None, :])
    first = np.where(waiting, queued[None, :], np.inf).argmin(axis=1)
    return [(int(ids[j]), int(prompts[j]), float(t[i] - queued[j])) if waiting[i, j] else (None, None, None)
            for i, j in enumerate(first)]


def bind(s: SchedulerState, rules: DiagnosisRules) -> Constraint | None:
    """What kept the head of state `s`'s queue out, in the scheduler's order (the module's
    docstring); None where nothing waited (or the engine did not say)."""
    if not s.waiting:
        return None
    if s.preempted:
        return Constraint.PREEMPTION
    if _free_slots(s) <= 0:
        return Constraint.CAP
    if s.head_blocks is not None and s.blocks_free is not None:
        if s.head_blocks > s.blocks_free:
            return Constraint.KV
    elif s.kv_pct is not None and s.kv_pct >= rules.kv_full_pct:  # no head known: the gauge alone
        return Constraint.KV
    if s.budget and s.steps and (s.step_tokens or 0) >= rules.budget_min_fill * s.steps * s.budget:
        return Constraint.BUDGET
    return Constraint.COMPUTE


def _free_slots(s: SchedulerState) -> float:
    return math.inf if s.cap is None or s.running is None else s.cap - s.running


def waiting_by(s: SchedulerState) -> dict[Constraint, float]:
    """The requests waiting at state `s`, by what held each: the head's constraint holds
    the queue, except that where it is the budget or compute only as many as the cap has
    free slots for wait on it, and the rest wait for the cap. (vLLM publishes its gauges
    after a step's finished requests left: the cap reads a slot or two short of full
    exactly when the queue is waiting for those slots.)"""
    if s.constraint is None or not s.waiting:
        return {}
    if s.constraint in (Constraint.BUDGET, Constraint.COMPUTE):
        head = min(s.waiting, max(_free_slots(s), 0.0))
        split = {s.constraint: head, Constraint.CAP: s.waiting - head}
        return {c: n for c, n in split.items() if n > 0}
    return {s.constraint: s.waiting}


@dataclass(frozen=True)
class Bindings:
    """A run's waiting, by what bound it: request-seconds of waiting per constraint over
    the loaded window, and the shares of it."""

    waited: float  # request-seconds of waiting in the window
    shares: tuple[tuple[Constraint, float], ...]  # largest first
    per_engine: tuple[tuple[str, Constraint], ...]  # each engine's largest, where the engines differ
    prefill_share: float | None  # of the tokens computed in the compute-bound states' steps
    step_ms: float | None  # the compute-bound states' mean step time
    head_blocks: int | None  # the largest head of the queue's need in a KV-bound state
    blocks_free: int | None  # and the free blocks then
    kv_pct: float | None  # and KV used then


def bindings(run_states: list[SchedulerState], start: float, stop: float, hold: float) -> Bindings:
    """Over the states inside [start, stop] (each standing until the next scrape of its
    engine, at most `hold`), weighted by the requests waiting."""
    weight: dict[Constraint, float] = {}
    by_engine: dict[str, dict[Constraint, float]] = {}
    prompt = tokens = compute_ms = compute_steps = 0.0
    kv_worst: SchedulerState | None = None
    for s, t_next in _with_next(run_states):
        if s.constraint is None or s.waiting is None or not start <= s.t <= stop:
            continue
        held = max(min(t_next, s.t + hold, stop) - s.t, 0.0)
        engine = by_engine.setdefault(s.engine, {})
        for c, n in waiting_by(s).items():
            weight[c] = weight.get(c, 0.0) + n * held
            engine[c] = engine.get(c, 0.0) + n * held
        if s.constraint is Constraint.COMPUTE and s.steps:
            tokens += s.step_tokens or 0.0
            prompt += s.prompt_tokens or 0.0
            compute_steps += s.steps
            compute_ms += (s.step_ms or 0.0) * s.steps
        if s.constraint is Constraint.KV and s.head_blocks is not None and (
                kv_worst is None or (kv_worst.head_blocks or 0) < s.head_blocks):
            kv_worst = s
    total = sum(weight.values())
    shares = tuple(sorted(((c, w / total) for c, w in weight.items()), key=lambda x: -x[1])) if total else ()
    tops = {engine: max(w, key=w.__getitem__) for engine, w in by_engine.items() if w}
    return Bindings(
        waited=total, shares=shares,
        per_engine=tuple(sorted(tops.items())) if len(set(tops.values())) > 1 else (),
        prefill_share=min(prompt / tokens, 1.0) if tokens else None,
        step_ms=compute_ms / compute_steps if compute_steps else None,
        head_blocks=kv_worst.head_blocks if kv_worst else None,
        blocks_free=kv_worst.blocks_free if kv_worst else None,
        kv_pct=kv_worst.kv_pct if kv_worst else None)


def _with_next(run_states: list[SchedulerState]) -> Iterable[tuple[SchedulerState, float]]:
    for i, s in enumerate(run_states):
        nxt = run_states[i + 1] if i + 1 < len(run_states) else None
        yield s, nxt.t if nxt is not None and nxt.engine == s.engine else math.inf


SCHEMA = {"run_id": pl.String, "t": pl.Float64, "engine": pl.String, "running": pl.Float64, "waiting": pl.Float64,
          "cap": pl.Int64, "kv_pct": pl.Float64, "blocks": pl.Int64, "blocks_free": pl.Int64, "block_size": pl.Int64,
          "budget": pl.Int64, "preempted": pl.Float64, "steps": pl.Float64, "step_tokens": pl.Float64,
          "prompt_tokens": pl.Float64, "step_ms": pl.Float64, "head_request": pl.Int64, "head_blocks": pl.Int64,
          "head_wait_s": pl.Float64, "constraint": pl.String}


def store(con: duckdb.DuckDBPyConnection, all_states: list[SchedulerState]) -> None:
    """Table `scheduler_states`: a row per state."""
    replace_table(con, "scheduler_states", all_states, SCHEMA)


def held_over_time(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    """Per scrape of run `run_id` at which requests waited: t, constraint (what held the head
    of the queue) and waiting (over the engines that constraint held); empty before the run
    was diagnosed."""
    if not table_exists(con, "scheduler_states"):
        return pl.DataFrame(schema={"t": pl.Float64, "constraint": pl.String, "waiting": pl.Float64})
    return signals.query(con, """
        SELECT t, "constraint", sum(waiting) AS waiting FROM scheduler_states
        WHERE run_id = ? AND "constraint" IS NOT NULL GROUP BY t, "constraint" ORDER BY t""", [run_id])
