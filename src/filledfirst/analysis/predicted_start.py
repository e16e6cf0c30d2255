"""An intervention's first rate, predicted before its search (`filledfirst frontier
predict`): the searches that have run are ingested and diagnosed in a scratch database
(the stages' own code: store, diagnosis), the engine's step time is fitted from their
scrapes (filledfirst.analysis.step_time), and the parent's knee is predicted with and
without the relaxation (filledfirst.analysis.prediction.shift). The intervention's search
then starts at the parent's measured knee moved by that shift (filledfirst.run.search),
so it brackets the knee it is expected to find instead of climbing to it from the
parent's.

The searches it is given are the study's searches that are not interventions
(filledfirst.plan): the parent alone often does not separate the step's terms (a cap of 2
is always full), the engine's fit over every setting does.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import duckdb

from filledfirst.analysis import prediction, signals
from filledfirst.analysis.diagnosis import write_diagnosis
from filledfirst.analysis.frontiers import probe_runs
from filledfirst.contracts.search import SEARCH_JSON, PredictedStart, SearchRecord
from filledfirst.errors import UserError
from filledfirst.frontier.plan import search_plan
from filledfirst.store.ingest import ingest
from filledfirst.study import Study

log = logging.getLogger(__name__)


def predict_start(study: Study, frontier: str, setting: str, searches: list[Path]) -> PredictedStart:
    """The predicted start of intervention `setting` of `frontier`, from `searches`
    (search.json files, or their folders), which include its parent's."""
    plan = search_plan(study, frontier, setting)
    relaxed = plan.interventions.get(setting)
    if relaxed is None:
        raise UserError(f"{frontier}/{setting} is not an intervention: only an intervention's start is predicted")
    records = {}
    for path in map(Path, searches):
        path = path / SEARCH_JSON if path.is_dir() else path
        try:
            record = SearchRecord.read(path)
        except FileNotFoundError:
            raise UserError(f"{path}: no such search.json") from None
        records[record.key] = record
    parent = records.get(f"{frontier}/{relaxed.parent}")
    if parent is None:
        raise UserError(f"{frontier}/{setting} relaxes {relaxed.parent!r}: give its search.json "
                        f"({', '.join(records) or 'none given'})")
    factor = relaxed.after / relaxed.before

    def start(shift: float | None, why: str, scope: str | None = None) -> PredictedStart:
        return PredictedStart(frontier=frontier, setting=setting, parent=relaxed.parent,
                              parent_fingerprint=parent.fingerprint, parent_knee_rps=parent.result.lo, shift=shift,
                              model_scope=scope, searches=list(records), why=why)

    with tempfile.TemporaryDirectory(prefix="filledfirst-predict-") as scratch:
        db = Path(scratch) / "searches.duckdb"
        ingest(list(map(Path, searches)), db)
        write_diagnosis(db, study.diagnosis)
        con = duckdb.connect(str(db), read_only=True)
        try:
            metas = signals.run_metas(con)
            groups = probe_runs(con, metas)
            found = prediction.searches(con, metas, {key: [p.run_id for p in probes] for key, probes in groups.items()})
        finally:
            con.close()
    s = found.get((frontier, relaxed.parent))
    if s is None:
        return start(None, f"no step model determined from the searches' scrapes, or no request of "
                           f"{relaxed.parent}'s probes answered")
    try:
        shift = prediction.shift(s, relaxed.knob, factor, plan.slo, plan.bounds.target)
    except ValueError as exc:  # a fitted step with no cost per token or sequence
        return start(None, str(exc), s.model.scope.value)
    knee = prediction.knee(s.model, s.limits, s.shape, plan.slo, plan.bounds.target)
    why = (f"{relaxed.knob} x{factor:g}: {relaxed.parent}'s predicted knee {knee:.3g} req/s "
           + ("does not move" if shift is None else f"moves {shift:+.0%}")
           + f", with the {s.model.scope.value}'s step time fitted on {s.model.runs}")
    log.info("%s/%s: %s", frontier, setting, why)
    return start(shift, why, s.model.scope.value)
