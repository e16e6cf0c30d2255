"""Two studies side by side (`filledfirst compare BASE CANDIDATE`): what differs in their
setup, their capacity searches' knees matched by (frontier, setting), their runs matched
by experiment name, each difference with a verdict that says whether it is more than
noise, what is on one side only, and the gate a scheduled job fails on
(filledfirst.compare.gate). Reads two databases `filledfirst diagnose` wrote; writes the
comparison as tables of a DuckDB file (filledfirst.compare.store) and as one offline HTML
page (filledfirst.compare.page)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from filledfirst.analysis import signals
from filledfirst.analysis.diagnosis.storage import stored_rules
from filledfirst.compare.figures import FIGURES, judge, offered_rps, samples
from filledfirst.compare.knees import knee_rows, label_changed
from filledfirst.compare.setup import setup_rows
from filledfirst.compare.verdicts import Change
from filledfirst.contracts import runmeta
from filledfirst.contracts.frontiers import FrontierRow
from filledfirst.errors import UserError
from filledfirst.frontier.interventions import widened
from filledfirst.paths import RESULTS_DB, results_database
from filledfirst.report.frontiers import frontier_rows
from filledfirst.store.tables import table_exists
from filledfirst.study import Compare, DiagnosisRules


def database(path: str | Path) -> Path:
    """The results database a path names (paths.results_database), which must exist."""
    db = results_database(path)
    if not db.is_file():
        raise UserError(f"{path}: no results database (a .duckdb file, or a results folder holding {RESULTS_DB})")
    return db


@dataclass
class Side:
    """What one database holds that the comparison reads."""

    path: Path
    runs: dict[str, str]  # experiment -> its latest study run's id
    documents: dict[str, dict[str, Any]]  # run id -> run.json, study runs only
    labels: dict[str, str | None]  # run id -> what filled first (table `diagnosis`)
    status: dict[str, str]  # run id -> the run's status
    rules: DiagnosisRules  # the diagnosis' (the attainment's SLO)
    knees: list[FrontierRow]  # table `frontiers`
    searches: dict[str, dict[str, Any]]  # "<frontier>/<setting>" -> one of its probes' run.json
    diagnosed: bool

    def drift(self, run_id: str) -> float | None:
        """The drift of the capacity search whose server the run ran on, right after it
        (run.json server.after_search); None for a run on a server of its own."""
        search = (self.documents.get(run_id, {}).get("server") or {}).get("after_search")
        knee = next((k for k in self.knees if f"{k.frontier}/{k.setting}" == search), None)
        return None if knee is None else knee.drift

    @classmethod
    def read(cls, con: duckdb.DuckDBPyConnection, path: Path) -> Side:
        metas = signals.run_metas(con)
        study = {rid: m for rid, m in metas.items() if m.frontier is None and m.part != "frontier"}
        runs: dict[str, str] = {}
        for rid, m in study.items():  # run_metas is in start order: the latest run of a name wins
            runs[m.experiment] = rid
        docs = signals.run_meta(con)
        searches: dict[str, dict[str, Any]] = {}
        for rid, m in metas.items():
            if m.frontier is not None and rid in docs:
                searches.setdefault(f"{m.frontier.name}/{m.frontier.setting}", docs[rid])
        diagnosed = table_exists(con, "diagnosis")
        labels = dict(con.execute("SELECT run_id, label FROM diagnosis").fetchall()) if diagnosed else {}
        return cls(path=path, runs=runs, documents={rid: docs[rid] for rid in study if rid in docs},
                   labels=labels, status={rid: m.status for rid, m in study.items()}, rules=stored_rules(con),
                   knees=frontier_rows(con), searches=searches, diagnosed=diagnosed)


@dataclass
class Comparison:
    base: Path
    candidate: Path
    rules: Compare  # when a difference counts
    setup: list[dict[str, Any]] = field(default_factory=list)
    knees: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)  # one row per (experiment, figure)
    labels: list[dict[str, Any]] = field(default_factory=list)  # one row per matched experiment
    one_side: list[dict[str, Any]] = field(default_factory=list)  # kind, name, side
    warnings: list[str] = field(default_factory=list)
    published: bool = False  # for a page others read: no host names, command lines or full paths

    def shown(self, side: Path) -> str:
        """A side's database as the page names it: its path, or published, its path from
        the folder both sides share (a night's folder, not where the server keeps it)."""
        if not self.published:
            return str(side)
        common = Path(os.path.commonpath([self.base, self.candidate]))
        return str(side.relative_to(common)) if side != common else side.name

    @property
    def verdicts(self) -> dict[str, int]:
        """How many knees and figures got each verdict."""
        out: dict[str, int] = {str(c): 0 for c in Change}
        for row in [*self.knees, *self.runs]:
            out[row["verdict"]] += 1
        return out


def compare(base: str | Path, candidate: str | Path, rules: Compare, publish: bool = False) -> Comparison:
    """The candidate study against the baseline; `publish`: its setup rows without host
    names and server command lines (filledfirst.contracts.runmeta.PRIVATE)."""
    paths = database(base), database(candidate)
    cons = [duckdb.connect(str(p), read_only=True) for p in paths]
    try:
        sides = [Side.read(con, p) for con, p in zip(cons, paths)]
        b, c = sides
        out = Comparison(base=paths[0], candidate=paths[1], rules=rules, published=publish)
        for side, name in ((b, "baseline"), (c, "candidate")):
            if not side.diagnosed:
                out.warnings.append(f"the {name} ({out.shown(side.path)}) has no diagnosis: run `filledfirst "
                                    "diagnose` on it for its labels and knees")
        out.knees, only_b, only_c = knee_rows(b.knees, c.knees, rules)
        matched = {name: (b.runs[name], c.runs[name]) for name in b.runs if name in c.runs}
        experiments = {n: (b.documents.get(rb, {}), c.documents.get(rc, {})) for n, (rb, rc) in matched.items()}
        searches = {n: (b.searches[n], c.searches[n]) for n in b.searches if n in c.searches}
        shown = runmeta.without_private if publish else dict
        out.setup = setup_rows(*({r: shown(d) for r, d in side.documents.items()} for side in (b, c)),
                               {n: (shown(x), shown(y)) for n, (x, y) in experiments.items()},
                               {n: (shown(x), shown(y)) for n, (x, y) in searches.items()})
        for name, (rb, rc) in matched.items():
            lb, lc = b.labels.get(rb), c.labels.get(rc)
            db, dc = b.drift(rb), c.drift(rc)
            out.labels.append({"experiment": name, "base_run_id": rb, "cand_run_id": rc,
                               "base_status": b.status[rb], "cand_status": c.status[rc],
                               "expect": c.documents.get(rc, {}).get("expect") or b.documents.get(rb, {}).get("expect"),
                               "base_label": lb, "cand_label": lc, "label_changed": label_changed(lb, lc),
                               "base_offered_rps": offered_rps(cons[0], rb),
                               "cand_offered_rps": offered_rps(cons[1], rc),
                               "base_drift": db, "cand_drift": dc})
            # A run on a search's server, right after it, shares the search's drift: a
            # figure measured while the server's speed moved by d cannot tell a change of d.
            least = widened(rules.run_min_change, db, dc)
            sb, sc = samples(cons[0], rb, b.rules), samples(cons[1], rc, c.rules)
            for fig in FIGURES:
                j = judge(fig, sb[fig.name], sc[fig.name], rules, least)
                out.runs.append({"experiment": name, "figure": fig.name, "unit": fig.unit, "better": fig.better,
                                 "base": j.base, "candidate": j.candidate, "change": j.change,
                                 "change_low": j.low, "change_high": j.high,
                                 "min_change": least if j.by_ratio else None,
                                 "by": "ratio" if j.by_ratio else "difference", "n_base": sb[fig.name].n,
                                 "n_cand": sc[fig.name].n, "verdict": str(j.verdict)})
        out.one_side = (
            [{"kind": "capacity search", "name": n, "side": "baseline"} for n in only_b]
            + [{"kind": "capacity search", "name": n, "side": "candidate"} for n in only_c]
            + [{"kind": "experiment", "name": n, "side": "baseline"} for n in b.runs if n not in c.runs]
            + [{"kind": "experiment", "name": n, "side": "candidate"} for n in c.runs if n not in b.runs])
        return out
    finally:
        for con in cons:
            con.close()
