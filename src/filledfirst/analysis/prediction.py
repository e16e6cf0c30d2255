"""A predicted knee for every limit: from the engine's fitted step time
(filledfirst.analysis.step_time), a setting's limits and a workload's shape, the request
rate at which each limit fills, in a fluid (mean) model of the engine at a steady rate λ:

- a request holds a slot for L = its output tokens + its prefill chunks − 1 steps, and
  computes u (its uncached prompt) + L tokens over them;
- the mean step is s(λ) = base / (1 − λ·K), K = (per token + per sequence)·E[L] +
  per token·E[u] + per context token·E[L·(u + output/2)]: the work λ requests a second
  bring into each step makes it longer (the last term: the context they hold, a
  request's prompt and on average half its output, over the steps it holds it);
- by Little's law a resource a request holds h units of per step is full when
  λ·s(λ)·E[h] reaches its capacity C:
  * the cap: h = L sequences steps, C = max_num_seqs;
  * KV blocks: h = L·(u + output) token steps (the ledger: a request can grow to its
    whole length, and vLLM preempts the newest when one cannot), C = the cache's tokens;
  * the token budget: h = L + u tokens, C = max_num_batched_tokens;
- compute: the prompts at the workload's target quantile take their chunks' steps (plus
  half the one in flight: a request arrives in a long step more often than in a short
  one) beyond the TTFT SLO, or the engine saturates (λ·K = 1); such a step carries the
  chunk, the sequences running and the prompt tokens that arrived over the step before;
- the ITL SLO: that step takes longer than the ITL SLO (the SLO judges a request's
  longest gap).

The smallest is what fills first, the next what fills next; a limit that would not fill
before the engine saturates has no knee. A data-parallel server is its
engines side by side (each its own cap and cache, the rate split evenly). The model
knows no burst: a trace's bursts fill a limit below its predicted knee, and a cached
prefix's blocks (shared) are not in the ledger.

Table `frontiers` stores each search's prediction beside its measured knee
(filledfirst.analysis.frontiers reads `predict`), an intervention's predicted shift, and
for a knee what single change the model says moves it by the least shift that counts
(`would_take`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

import duckdb
import msgspec
import numpy as np

from filledfirst.analysis import numbers
from filledfirst.analysis.step_time import Scope, StepModel, engine_key, read, setting_key
from filledfirst.contracts.frontiers import Prediction
from filledfirst.contracts.runmeta import RunMeta
from filledfirst.contracts.scheduler import Constraint
from filledfirst.contracts.search import Knob, Slo

BISECTIONS = 60
MAX_FACTOR = 16.0  # what would it take: the largest change of one limit considered


class Limit(StrEnum):
    """What a predicted knee is the knee of: a limit the scheduler checks (in its words,
    filledfirst.contracts.scheduler.Constraint), or an SLO the step time breaks."""

    CAP = Constraint.CAP.value
    KV = Constraint.KV.value
    BUDGET = Constraint.BUDGET.value
    COMPUTE = Constraint.COMPUTE.value
    ITL = "ITL SLO"


@dataclass(frozen=True)
class Limits:
    """A setting's limits, per engine (None: unknown, so never predicted to fill)."""

    cap: float | None
    kv_tokens: float | None
    budget: float | None
    engines: int = 1


@dataclass(frozen=True)
class Shape:
    """A workload's requests: uncached prompt tokens and output tokens, each request's."""

    uncached: np.ndarray
    output: np.ndarray

    @property
    def requests(self) -> int:
        return len(self.output)


@dataclass(frozen=True)
class _Work:
    """A request's work in the step time's terms (seconds): the step's costs, the steps a
    request holds a slot for (each request's, and their mean), the token steps of context
    it holds and of KV it holds (the ledger: its whole length), and K, the seconds a
    request a second adds to the mean step's (s(λ) = base / (1 − λ·K), the module doc)."""

    base: float
    per_token: float
    per_seq: float
    per_context: float
    steps_held: np.ndarray
    held: float
    context_held: float
    kv_held: float
    k: float


def _work(model: StepModel, limits: Limits, shape: Shape) -> _Work:
    base, per_token, per_seq = (max(x, 0.0) / 1000 for x in (model.base_ms, model.per_token_ms, model.per_seq_ms))
    per_context = max(model.per_context_ms or 0.0, 0.0) / 1000 / 1000  # s per token held
    u, o = shape.uncached, shape.output
    chunks = np.maximum(np.ceil(np.maximum(u, 1) / (limits.budget or math.inf)), 1)
    steps_held = np.maximum(o + chunks - 1, 1)
    held = float(steps_held.mean())
    context_held = float((steps_held * (u + o / 2)).mean())  # token steps of context a request holds
    k = (per_token + per_seq) * held + per_token * float(u.mean()) + per_context * context_held
    if k <= 0:
        raise ValueError("a step time with no cost per token or sequence predicts no knee")
    kv_held = float((steps_held * (u + o)).mean())
    return _Work(base, per_token, per_seq, per_context, steps_held, held, context_held, kv_held, k)


def knees(model: StepModel, limits: Limits, shape: Shape, slo: Slo, target: float) -> dict[Limit, float]:
    """Each limit's predicted knee, requests per second over the whole server, under `slo`
    met by the share `target` of the requests (the quantile the prompts are judged at)."""
    w = _work(model, limits, shape)
    base, per_token, per_seq, per_context, k = w.base, w.per_token, w.per_seq, w.per_context, w.k
    budget = limits.budget or math.inf
    u, held, context_held = shape.uncached, w.held, w.context_held
    saturation = 1 / k

    def step(rate: float) -> float:
        return base / (1 - rate * k) if rate * k < 1 else math.inf

    def running(rate: float) -> float:
        return rate * step(rate) * held

    def fills(load: Callable[[float], float], capacity: float | None) -> float | None:
        """The rate at which load(rate), increasing, reaches capacity; None: unknown, or not
        before the engine saturates."""
        if capacity is None or load(saturation * (1 - 1e-9)) < capacity:
            return None
        if load(0.0) >= capacity:
            return 0.0
        lo, hi = 0.0, saturation
        for _ in range(BISECTIONS):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if load(mid) < capacity else (lo, mid)
        return lo

    q = float(np.quantile(u, target))
    q_chunks = math.ceil(max(q, 1) / budget)

    def chunk_step(rate: float) -> float:
        """A step carrying a prompt chunk of that quantile: beside it the sequences running
        and the prompt tokens that arrived over the step before, itself as long (a fixed
        point), up to the budget."""
        n = running(rate)
        context = per_context * rate * step(rate) * context_held
        own = base + per_token * (min(q, budget) + n) + per_seq * n + context
        rest = 1 - per_token * rate * float(u.mean())
        full = base + per_token * budget + per_seq * n + context
        return min(own / rest if rest > 0 else math.inf, full)

    found = {
        Limit.CAP: fills(running, limits.cap),
        Limit.KV: fills(lambda r: r * step(r) * w.kv_held, limits.kv_tokens),
        Limit.BUDGET: fills(lambda r: r * step(r) * (held + float(u.mean())), limits.budget),
        Limit.COMPUTE: _or(fills(lambda r: (q_chunks + 0.5) * chunk_step(r), slo.ttft_ms / 1000), saturation),
        Limit.ITL: fills(chunk_step, slo.itl_ms / 1000),
    }
    return {limit: rate * limits.engines for limit, rate in found.items() if rate is not None}


def throughput(model: StepModel, limits: Limits, shape: Shape, concurrency: int) -> float:
    """Completions a second of a closed loop of `concurrency` requests of the shape over the
    whole server (the paired check's quantity, filledfirst.frontier.paired): each engine
    runs r of its share of them, as many as its cap, its KV cache (the ledger: a request's
    whole length, held for its steps) and its token budget let run at once; by Little's law
    its mean step is then s = base + r·K/E[L] and it completes r / (s·E[L]) a second."""
    w = _work(model, limits, shape)
    # KV tokens a running request holds, and the tokens it puts in a step
    ledger = w.kv_held / w.held
    step_tokens = (w.held + float(shape.uncached.mean())) / w.held
    running = min(concurrency / limits.engines, limits.cap or math.inf,
                  (limits.kv_tokens or math.inf) / ledger, (limits.budget or math.inf) / step_tokens)
    return limits.engines * running / (w.base * w.held + running * w.k)


def paired_shift(parent: Search, knob: Knob, factor: float, concurrency: int) -> float:
    """How much more a closed loop of `concurrency` completes a second with `knob` `factor`
    times larger, as a share: what the paired check measures, predicted."""
    before = throughput(parent.model, parent.limits, parent.shape, concurrency)
    after = throughput(*changed(RELAXES[knob], factor, parent.model, parent.limits), parent.shape, concurrency)
    return after / before - 1


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def first_two(found: Mapping[Limit, float]) -> list[tuple[Limit, float]]:
    """What fills first and what fills next, with their knees."""
    return sorted(found.items(), key=lambda kv: kv[1])[:2]


# The knob that relaxes a limit (compute: every term of the step time divided by the factor).
KNOBS: dict[Limit, str] = {Limit.CAP: Knob.SEQS.value, Limit.KV: Knob.KV.value,
                           Limit.BUDGET: "max_num_batched_tokens", Limit.COMPUTE: "faster steps"}
_FIELD = {Limit.CAP: "cap", Limit.KV: "kv_tokens", Limit.BUDGET: "budget"}
RELAXES = {Knob(KNOBS[limit]): limit for limit in (Limit.CAP, Limit.KV)}  # the limit an intervention's knob relaxes


def changed(limit: Limit, factor: float, model: StepModel, limits: Limits) -> tuple[StepModel, Limits]:
    """The model and limits with `limit`'s knob `factor` times larger (compute: steps that
    many times faster)."""
    if limit in _FIELD:
        now = getattr(limits, _FIELD[limit])
        return model, replace(limits, **{_FIELD[limit]: None if now is None else now * factor})
    context = None if model.per_context_ms is None else model.per_context_ms / factor
    return msgspec.structs.replace(model, base_ms=model.base_ms / factor, per_token_ms=model.per_token_ms / factor,
                                   per_seq_ms=model.per_seq_ms / factor, per_context_ms=context), limits


def knee(model: StepModel, limits: Limits, shape: Shape, slo: Slo, target: float) -> float:
    return min(knees(model, limits, shape, slo, target).values())


def shift(parent: Search, knob: Knob, factor: float, slo: Slo, target: float) -> float | None:
    """How far the parent's predicted knee moves, as a share, with `knob` `factor` times
    larger (None: it has no knee to move)."""
    before = knee(parent.model, parent.limits, parent.shape, slo, target)
    after = knee(*changed(RELAXES[knob], factor, parent.model, parent.limits), parent.shape, slo, target)
    return after / before - 1 if before > 0 else None


def least_factor(limit: Limit, goal: float, model: StepModel, limits: Limits, shape: Shape, slo: Slo,
                 target: float) -> tuple[float | None, float]:
    """The least factor of `limit`'s knob (up to MAX_FACTOR) that brings the knee to
    `goal` (None: none does), and the knee at MAX_FACTOR."""
    def at(f: float) -> float:
        return knee(*changed(limit, f, model, limits), shape, slo, target)

    most = at(MAX_FACTOR)
    if most < goal:
        return None, most
    lo, hi = 1.0, MAX_FACTOR
    for _ in range(30):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if at(mid) >= goal else (mid, hi)
    return hi, most


def would_take(model: StepModel, limits: Limits, shape: Shape, slo: Slo, target: float, share: float) -> str:
    """The cheapest change of one limit (its least factor, up to MAX_FACTOR) the model says
    moves the knee up by `share`, the limits that cannot alone (how far x MAX_FACTOR moves
    it), and the faster steps it takes (every knee moves with them, so never the cheapest)."""
    now = knee(model, limits, shape, slo, target)
    goal = now * (1 + share)
    can, cannot = [], []
    for limit in _FIELD:
        if getattr(limits, _FIELD[limit]) is None:
            continue
        factor, most = least_factor(limit, goal, model, limits, shape, slo, target)
        if factor is None:
            cannot.append(f"{KNOBS[limit]} (x{MAX_FACTOR:g}: {numbers.change(most / now - 1)})")
        else:
            can.append((factor, KNOBS[limit]))
    steps, _ = least_factor(Limit.COMPUTE, goal, model, limits, shape, slo, target)
    faster = "faster steps" if steps is None else f"steps x{steps:.2g} faster"
    head = (f"{min(can)[1]} x{min(can)[0]:.2g}" if can else f"no limit alone; {faster}")
    out = f"{numbers.change(share)}: {head}"
    if can:
        out += f" (or {faster})"
    return out + ("" if not cannot else "; not alone: " + ", ".join(cannot))


def predict(model: StepModel, limits: Limits, shape: Shape, slo: Slo, target: float, measured_rps: float | None,
            min_shift: float) -> Prediction:
    """A search's prediction beside its measured knee (the geometric mean of lo and hi)."""
    found = knees(model, limits, shape, slo, target)
    (first, rps), *rest = first_two(found)
    nxt = rest[0] if rest else (None, None)
    return Prediction(
        predicted_rps=rps, predicted_first=first.value, predicted_next=None if nxt[0] is None else nxt[0].value,
        predicted_next_rps=nxt[1], predicted_cap_rps=found.get(Limit.CAP), predicted_kv_rps=found.get(Limit.KV),
        predicted_budget_rps=found.get(Limit.BUDGET), predicted_compute_rps=found.get(Limit.COMPUTE),
        predicted_itl_rps=found.get(Limit.ITL), model_scope=model.scope.value,
        predicted_ratio=None if measured_rps is None or rps <= 0 else measured_rps / rps,
        would_take=would_take(model, limits, shape, slo, target, min_shift))


def fills_after(parent: Prediction, shift: float) -> tuple[str, float, bool]:
    """What the parent's prediction says fills first at its knee moved by `shift` (a
    relaxation nothing measured): (the limit, its knee, whether it is the relaxed one
    again). The parent's next limit where the moved knee reaches it, the first one again,
    at the moved knee, where it does not."""
    moved_rps = parent.predicted_rps * (1 + shift)
    if (parent.predicted_next is not None and parent.predicted_next_rps is not None
            and moved_rps >= 0.99 * parent.predicted_next_rps):
        return parent.predicted_next, parent.predicted_next_rps, False
    return parent.predicted_first, moved_rps, True


@dataclass(frozen=True)
class Search:
    """What a search's prediction is made of: its model, limits and shape."""

    model: StepModel
    limits: Limits
    shape: Shape


def searches(con: duckdb.DuckDBPyConnection, metas: Mapping[str, RunMeta],
             probes: Mapping[tuple[str, str], list[str]]) -> dict[tuple[str, str], Search]:
    """(frontier, setting) -> its model (the setting's own where `determined`, else its
    engine's where that is), its limits (the probes' scheduler states: the largest cap, cache and budget
    seen, per engine) and its shape (the probes' answered requests); a search with none
    of these is left out."""
    models = read(con)
    own = {m.setting: m for m in models if m.scope is Scope.SETTING and m.determined}
    engine = {m.setting: m for m in models if m.scope is Scope.ENGINE and m.determined}
    out = {}
    for key, run_ids in probes.items():
        ids = [r for r in run_ids if r in metas]
        if not ids:
            continue
        meta = metas[ids[0]]
        model = own.get(setting_key(meta)) or engine.get(engine_key(meta))
        marks = ",".join("?" * len(ids))
        cap, kv, budget, engines = con.execute(f"""
            SELECT max(cap), max(blocks * block_size), max(budget), count(DISTINCT engine)
            FROM scheduler_states WHERE run_id IN ({marks})""", ids).fetchall()[0]
        reqs = con.execute(f"""
            SELECT prompt_tokens - coalesce(cached_tokens, 0), output_tokens FROM requests
            WHERE status = 'ok' AND run_id IN ({marks}) AND output_tokens IS NOT NULL""", ids).fetchall()
        if model is None or not reqs or not engines:
            continue
        arr = np.asarray(reqs, dtype=float)
        out[key] = Search(model, Limits(cap, kv, budget, int(engines)), Shape(arr[:, 0], arr[:, 1]))
    return out
