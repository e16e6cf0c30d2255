"""A run's figures on each side, each with a verdict that takes the request counts into
account: a bootstrap over the run's requests (resampled with replacement, the same seed
for every figure) gives the interval of candidate / baseline, or of candidate - baseline
for a share; a figure changed when that interval excludes no change and, for a ratio, the
change is at least `run_min_change` (sampling noise is not the only noise: a machine's
speed moves between two runs too).

The figures are the report's, over the same requests (filledfirst.analysis.signals):
TTFT p50 and p90 of the ok requests, ITL p50 (per token, pooled over the ok requests'
gaps: resampling a request takes all its gaps), SLO attainment (the share of sent
requests meeting the diagnosis SLO) and the share of sent requests that failed.

Attainment, not goodput (attainment x the offered rate): a run placed at a share of a
knee offers a rate that follows its side's knee, so goodput would repeat the knee's
change, judged without the knee's drift allowance. The offered rates are shown beside
the run (`offered_rps`), not judged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import numpy as np

from filledfirst.analysis.signals import OFFERED
from filledfirst.compare.verdicts import Change
from filledfirst.request_metrics import FAILED, ITL_GAPS, NOT_SENT, REQUEST_STALL, slo_met, ttft_ms
from filledfirst.study import Compare, DiagnosisRules

# The bootstrap's seed, one for every figure: the same two databases give the same verdicts.
SEED = 0


@dataclass(frozen=True)
class Figure:
    name: str
    unit: str
    better: str  # "lower" or "higher": which way is an improvement
    share: bool = False  # compared by difference, not ratio


FIGURES = (
    Figure("TTFT p50", "ms", "lower"),
    Figure("TTFT p90", "ms", "lower"),
    Figure("ITL p50", "ms", "lower"),
    Figure("SLO attainment", "share", "higher", share=True),
    Figure("failed", "share", "lower", share=True),
)


@dataclass(frozen=True)
class Sample:
    """One figure's data on one side: values, the request each belongs to (0..n-1), and
    the statistic of a weighting of the requests (weights: how often each was drawn)."""

    values: np.ndarray
    group: np.ndarray
    n: int
    stat: Callable[[np.ndarray, np.ndarray], float]  # (sorted values, their weights) -> figure

    def point(self) -> float | None:
        return self.stat(self.values, np.ones(len(self.values))) if self.n else None


def _quantile(q: float) -> Callable[[np.ndarray, np.ndarray], float]:
    def stat(values: np.ndarray, weights: np.ndarray) -> float:
        if weights.sum() == 0:
            return np.nan
        if np.all(weights == 1):  # the point estimate: linear, as DuckDB's quantile_cont
            return float(np.quantile(values, q))
        cum = np.cumsum(weights)
        return float(values[min(np.searchsorted(cum, q * cum[-1]), len(values) - 1)])
    return stat


def _mean(values: np.ndarray, weights: np.ndarray) -> float:
    return float((values * weights).sum() / weights.sum()) if weights.sum() else np.nan


def _sample(values, groups, stat) -> Sample:
    values, groups = np.asarray(values, dtype=float), np.asarray(groups)
    order = np.argsort(values, kind="stable")
    uniq, index = np.unique(groups, return_inverse=True)
    return Sample(values=values[order], group=index[order], n=len(uniq), stat=stat)


def offered_rps(con: duckdb.DuckDBPyConnection, run_id: str) -> float | None:
    """The rate a run's schedule offered (filledfirst.analysis.signals.OFFERED)."""
    row = con.execute(f"SELECT offered_rps FROM ({OFFERED}) WHERE run_id = ?", [run_id]).fetchone()
    return row[0] if row else None


def samples(con: duckdb.DuckDBPyConnection, run_id: str, rules: DiagnosisRules) -> dict[str, Sample]:
    """The data of every figure of one run; `rules`: the database's (its attainment's SLO)."""
    ttft = con.execute(f"SELECT request_id, {ttft_ms()} AS t FROM requests WHERE run_id = ? AND status = 'ok'",
                       [run_id]).fetchall()
    gaps = con.execute(f"SELECT request_id, itl_ms FROM ({ITL_GAPS}) WHERE run_id = ?", [run_id]).fetchall()
    sent = con.execute(f"""
        SELECT q.request_id, {FAILED} AS failed,
               coalesce({slo_met(ttft_ms('q'), 's.max_gap_ms')}, false) AS met
        FROM requests q LEFT JOIN ({REQUEST_STALL}) s USING (run_id, request_id)
        WHERE q.run_id = $run AND q.status <> '{NOT_SENT}'""",
                       {"run": run_id, "slo_ttft": rules.slo_ttft_ms, "slo_itl": rules.slo_itl_ms}).fetchall()
    ids = [r[0] for r in sent]
    return {
        "TTFT p50": _sample([t for _, t in ttft], [i for i, _ in ttft], _quantile(0.5)),
        "TTFT p90": _sample([t for _, t in ttft], [i for i, _ in ttft], _quantile(0.9)),
        "ITL p50": _sample([g for _, g in gaps], [i for i, _ in gaps], _quantile(0.5)),
        "SLO attainment": _sample([float(r[2]) for r in sent], ids, _mean),
        "failed": _sample([float(r[1]) for r in sent], ids, _mean),
    }


def _replicates(s: Sample, rng: np.random.Generator, b: int) -> np.ndarray:
    out = np.empty(b)
    for k in range(b):
        drawn = rng.multinomial(s.n, np.full(s.n, 1 / s.n))
        out[k] = s.stat(s.values, drawn[s.group])
    return out


@dataclass(frozen=True)
class Judged:
    base: float | None
    candidate: float | None
    change: float | None  # candidate / base - 1, or candidate - base for a share
    low: float | None  # the change's bootstrap interval
    high: float | None
    verdict: Change
    by_ratio: bool = True  # False: compared by difference (a share, or a baseline of 0)


def judge(figure: Figure, base: Sample, cand: Sample, rules: Compare, min_change: float | None = None) -> Judged:
    """`min_change`: the least ratio change that counts (None: rules.run_min_change)."""
    b, c = base.point(), cand.point()
    by_ratio = not figure.share and bool(b)
    if b is None or c is None or np.isnan(b) or np.isnan(c):
        return Judged(b, c, None, None, None, Change.NOT_COMPARABLE, by_ratio)
    rng = np.random.default_rng(SEED)
    rb, rc = _replicates(base, rng, rules.resamples), _replicates(cand, rng, rules.resamples)
    tail = (1 - rules.confidence) / 2 * 100
    if by_ratio:
        with np.errstate(divide="ignore", invalid="ignore"):
            diffs = rc / rb - 1
        change = c / b - 1
    else:
        diffs, change = rc - rb, c - b
    diffs = diffs[np.isfinite(diffs)]
    if not len(diffs):
        return Judged(b, c, change, None, None, Change.NOT_COMPARABLE, by_ratio)
    low, high = (float(x) for x in np.percentile(diffs, [tail, 100 - tail]))
    beyond = low > 0 or high < 0
    least = rules.run_min_change if min_change is None else min_change
    large = abs(change) >= least if by_ratio else True
    if not (beyond and large) or change == 0:
        verdict = Change.SAME
    else:
        verdict = Change.HIGHER if change > 0 else Change.LOWER
    return Judged(b, c, change, low, high, verdict, by_ratio)
