"""The engine's step time, fitted from what the scrapes saw: per server setting, the time
of one engine step as a linear function of what it carries,

    step_ms = base_ms + per_token_ms x tokens in the step + per_seq_ms x sequences running
              + per_context_ms x thousands of tokens held in the KV cache,

fitted by least squares over the intervals between scrapes (table `scheduler_states`:
each interval's steps, their tokens, the running count and the KV blocks in use), each
weighted by its steps. The simplest form that separates the costs a limit trades
against: a bigger budget puts more tokens in a step, a bigger cap more sequences, and
each sequence's attention reads its whole context, so a sequence of 1,400 tokens costs
more than one of 300 (on the CPU engine a decode step at 64 sequences of the decode shape
took about half what the same count of the KV-heavy shape's did). The context term is
kept only where its intervals vary the context apart from the running count: the fit with
it passes `determined` and puts the context's cost above zero by more than two standard
errors; otherwise the fit is the three terms alone, `per_context_ms` None (an engine that
does not say its KV use, too).

Checked against what it did not fit: a decoding request's gaps between tokens are step
times, so each run's client ITL p50 over the step time the model gives for that run's
mean step is near 1 where the model holds (`itl_ratio`, the median over the setting's
runs).

Table `step_models`, a row per setting (scope `setting`: its server settings as sorted
JSON, the runs on it named by experiment or search setting), and a row per engine (scope
`engine`: the model and launcher every setting of it shares, fitted over all their
intervals). The settings differ in their limits, not in the cost of a token or a
sequence, so the engine's row stands in where a setting's own intervals do not separate
the terms (a cap of 2 always full), and it is the model of a setting not run yet (an
intervention, filledfirst.analysis.prediction)."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Iterable, Mapping

import duckdb
import msgspec
import numpy as np
import polars as pl

from filledfirst.contracts.runmeta import FrontierProbe, RunMeta
from filledfirst.contracts.scheduler import SchedulerState
from filledfirst.store.tables import replace_table, table_exists

MIN_STEPS = 3  # an interval's mean step needs a few steps behind it
MIN_INTERVALS = 10  # and a fit of three terms some intervals beyond them
MIN_R2 = 0.5  # a setting's own fit explains at least this much of its steps' variance to be used alone


class Scope(StrEnum):
    SETTING = "setting"
    ENGINE = "engine"


class StepModel(msgspec.Struct, frozen=True, kw_only=True):
    """One server setting's step time; the standard errors are None where the intervals
    do not separate the terms (e.g. a cap of 2 always full: the sequences never vary)."""

    scope: Scope
    setting: str  # its server settings (scope engine: the model and launcher), sorted JSON
    runs: str  # the runs on it: their experiments or search settings
    intervals: int
    steps: float
    base_ms: float
    per_token_ms: float
    per_seq_ms: float
    base_se_ms: float | None
    per_token_se_ms: float | None
    per_seq_se_ms: float | None
    r2: float | None
    itl_ratio: float | None  # client ITL p50 over the modelled step, median over the runs
    # ms per 1,000 tokens held in the KV cache (None: not in the fit)
    per_context_ms: float | None = None
    per_context_se_ms: float | None = None

    def step_ms(self, tokens: float, seqs: float, context: float | None = None) -> float:
        """A step carrying `tokens`, with `seqs` running and `context` tokens held in KV."""
        held = (self.per_context_ms or 0.0) * (context or 0.0) / 1000
        return self.base_ms + self.per_token_ms * tokens + self.per_seq_ms * seqs + held

    @property
    def determined(self) -> bool:
        """Every term separated (a standard error each), none below zero by more than two
        of its standard errors, some cost per token or sequence, and the fit explains at
        least MIN_R2 of the variance: a model to predict with (its terms taken at >= 0)."""
        terms = [self.base_ms, self.per_token_ms, self.per_seq_ms]
        errors = [self.base_se_ms, self.per_token_se_ms, self.per_seq_se_ms]
        if self.per_context_ms is not None:
            terms.append(self.per_context_ms)
            errors.append(self.per_context_se_ms)
        return (all(e is not None and t >= -2 * e for t, e in zip(terms, errors))
                and self.per_token_ms + self.per_seq_ms > 0 and self.r2 is not None and self.r2 >= MIN_R2)


class Fit(msgspec.Struct, frozen=True):
    coef: tuple[float, ...]  # base, per token, per sequence[, per 1,000 tokens of context]
    se: tuple[float, ...] | None
    r2: float | None


def fit(tokens: np.ndarray, seqs: np.ndarray, step_ms: np.ndarray, steps: np.ndarray,
        context: np.ndarray | None = None) -> Fit:
    """Weighted least squares of step_ms on (1, tokens per step, sequences[, thousands of
    context tokens]), weights the steps behind each interval."""
    x = np.column_stack([np.ones_like(tokens), tokens, seqs, *([] if context is None else [context])])
    terms = x.shape[1]
    w = np.sqrt(steps)
    coef, _, rank, _ = np.linalg.lstsq(x * w[:, None], step_ms * w, rcond=None)
    resid = step_ms - x @ coef
    dof = len(step_ms) - terms
    se = None
    if rank == terms and dof > 0:
        sigma2 = float(np.sum(steps * resid**2) / dof)
        cov = sigma2 * np.linalg.inv((x * steps[:, None]).T @ x)
        se = tuple(float(v) for v in np.sqrt(np.diag(cov)))
    mean = np.average(step_ms, weights=steps)
    total = float(np.sum(steps * (step_ms - mean) ** 2))
    r2 = 1 - float(np.sum(steps * resid**2)) / total if total > 0 else None
    return Fit(tuple(float(c) for c in coef), se, r2)


def setting_key(meta: RunMeta) -> str:
    return json.dumps(meta.server.settings, sort_keys=True)


def engine_key(meta: RunMeta) -> str:
    return json.dumps({"launcher": meta.server.launcher, "model": meta.model.name}, sort_keys=True)


def _name(meta: RunMeta) -> str:
    probe = meta.frontier
    return f"{probe.name}/{probe.setting}" if isinstance(probe, FrontierProbe) else meta.experiment


def models(states: Iterable[SchedulerState], metas: Mapping[str, RunMeta],
           itl_p50_ms: Mapping[str, float | None]) -> list[StepModel]:
    """A model per server setting, and one per engine, with enough intervals
    (MIN_INTERVALS of MIN_STEPS steps)."""
    rows = [(s.run_id, s.steps, s.step_tokens / s.steps, s.running, s.step_ms, _context(s)) for s in states
            if s.steps is not None and s.steps >= MIN_STEPS and s.step_ms is not None
            and s.step_tokens is not None and s.running is not None and s.run_id in metas]
    frame = pl.DataFrame(rows, schema={"run_id": pl.String, "steps": pl.Float64, "tokens": pl.Float64,
                                       "seqs": pl.Float64, "step_ms": pl.Float64, "context": pl.Float64},
                         orient="row")
    out = []
    for scope, key in ((Scope.SETTING, setting_key), (Scope.ENGINE, engine_key)):
        keyed = frame.with_columns(key=pl.col("run_id").replace_strict(
            {r: key(m) for r, m in metas.items()}, default=None))
        for (k,), g in keyed.group_by("key", maintain_order=True):
            if g.height >= MIN_INTERVALS:
                out.append(_model(scope, str(k), g, metas, itl_p50_ms))
    return out


def _context(s: SchedulerState) -> float | None:
    """The tokens an interval's engine held in its KV cache (None: it did not say)."""
    if s.blocks is None or s.blocks_free is None or s.block_size is None:
        return None
    return float((s.blocks - s.blocks_free) * s.block_size)


def _model(scope: Scope, key: str, g: pl.DataFrame, metas: Mapping[str, RunMeta],
           itl_p50_ms: Mapping[str, float | None]) -> StepModel:
    """The fit with the context term where every interval says its context, the fit is
    determined and the context's cost is above zero by more than two standard errors (a
    shape whose contexts all have one length cannot tell them from its sequences); else
    the three terms alone."""
    names = sorted({_name(metas[str(r)]) for r in g["run_id"].unique()})
    columns = [g[c].to_numpy() for c in ("tokens", "seqs", "step_ms", "steps")]
    if g["context"].null_count() == 0 and g["context"].std() > 0:
        model = _as_model(scope, key, names, g, fit(*columns, g["context"].to_numpy() / 1000), itl_p50_ms)
        cost, se = model.per_context_ms, model.per_context_se_ms
        if model.determined and cost is not None and se is not None and cost > 2 * se:
            return model
    return _as_model(scope, key, names, g, fit(*columns), itl_p50_ms)


def _as_model(scope: Scope, key: str, names: list[str], g: pl.DataFrame, f: Fit,
              itl_p50_ms: Mapping[str, float | None]) -> StepModel:
    se = f.se or (None,) * len(f.coef)
    context = len(f.coef) == 4
    model = StepModel(scope=scope, setting=key, runs=", ".join(names), intervals=g.height,
                      steps=float(g["steps"].sum()), base_ms=f.coef[0], per_token_ms=f.coef[1],
                      per_seq_ms=f.coef[2], base_se_ms=se[0], per_token_se_ms=se[1], per_seq_se_ms=se[2],
                      r2=f.r2, itl_ratio=None, per_context_ms=f.coef[3] if context else None,
                      per_context_se_ms=se[3] if context else None)
    ratios = []
    for (run_id,), r in g.group_by("run_id"):
        w = r["steps"].to_numpy()
        mean = {c: np.average(r[c].to_numpy(), weights=w) for c in ("tokens", "seqs")}
        held = np.average(r["context"].to_numpy(), weights=w) if context else None
        step = model.step_ms(mean["tokens"], mean["seqs"], held)
        itl = itl_p50_ms.get(str(run_id))
        if itl is not None and step > 0:
            ratios.append(itl / step)
    return msgspec.structs.replace(model, itl_ratio=float(np.median(ratios)) if ratios else None)


SCHEMA = {"scope": pl.String, "setting": pl.String, "runs": pl.String, "intervals": pl.Int64, "steps": pl.Float64,
          "base_ms": pl.Float64, "per_token_ms": pl.Float64, "per_seq_ms": pl.Float64,
          "base_se_ms": pl.Float64, "per_token_se_ms": pl.Float64, "per_seq_se_ms": pl.Float64,
          "r2": pl.Float64, "itl_ratio": pl.Float64, "per_context_ms": pl.Float64, "per_context_se_ms": pl.Float64}


def store(con: duckdb.DuckDBPyConnection, step_models: list[StepModel]) -> None:
    """Table `step_models`: a row per setting and per engine."""
    replace_table(con, "step_models", step_models, SCHEMA)


def read(con: duckdb.DuckDBPyConnection) -> list[StepModel]:
    """Table `step_models` as records; none before the diagnosis wrote it."""
    if not table_exists(con, "step_models"):
        return []
    return [msgspec.convert(row, StepModel) for row in
            con.sql("SELECT * FROM step_models ORDER BY scope DESC, steps DESC").pl().to_dicts()]


def fitted_points(con: duckdb.DuckDBPyConnection, metas: Mapping[str, RunMeta],
                  step_models: list[StepModel]) -> pl.DataFrame:
    """Every interval a model was fitted on: its setting's runs, the step the model gives
    and the step measured, and its steps."""
    by_setting = {m.setting: m for m in step_models if m.scope is Scope.SETTING}
    run_model = {r: by_setting[k] for r, m in metas.items() if (k := setting_key(m)) in by_setting}
    frame = con.sql(f"""
        SELECT run_id, steps, step_tokens / steps AS tokens, running AS seqs, step_ms,
               (blocks - blocks_free) * block_size AS context FROM scheduler_states
        WHERE steps >= {MIN_STEPS} AND step_ms IS NOT NULL AND step_tokens IS NOT NULL
          AND running IS NOT NULL""").pl()
    rows = [(run_model[r].runs, run_model[r].step_ms(tokens, seqs, context), ms, steps)
            for r, steps, tokens, seqs, ms, context in frame.iter_rows() if r in run_model]
    return pl.DataFrame(rows, schema={"setting": pl.String, "modelled_ms": pl.Float64, "measured_ms": pl.Float64,
                                      "steps": pl.Float64}, orient="row")
