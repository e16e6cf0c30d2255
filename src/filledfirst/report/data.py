"""What the report reads from the database, read once: `load(con)` -> `ReportData`, which
every section of the report (filledfirst.report.sections) takes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb

from filledfirst.analysis import prefix_cache, request_path, signals
from filledfirst.analysis.diagnosis.storage import stored_rules
from filledfirst.contracts import runmeta
from filledfirst.contracts.diagnosis import DiagnosisRow
from filledfirst.contracts.frontiers import FrontierRow
from filledfirst.contracts.runmeta import RunMeta
from filledfirst.report import frontiers
from filledfirst.report.rows import PrefixCacheRow, RoleRow, RunRates, RunRow
from filledfirst.store.study_parts import stored_parts
from filledfirst.store.tables import table_exists
from filledfirst.study import DiagnosisRules, Section


@dataclass(frozen=True)
class ReportData:
    # Kept for what is read run by run (each run's requests and series), one run at a time.
    con: duckdb.DuckDBPyConnection
    summary: list[RunRow]  # signals.run_summary, one row per run, by start time
    roles: list[RoleRow]  # signals.role_summary
    metas: dict[str, RunMeta]  # run.json typed, per run id
    documents: dict[str, dict[str, Any]]  # run.json whole, only for the setup dumps
    diagnosis: list[DiagnosisRow]  # table `diagnosis`; empty before `filledfirst diagnose`
    rates: dict[str, RunRates]  # signals.run_rates, per run id
    queue_shares: dict[str, float | None]  # vLLM's queue over TTFT (None: no per-request timings)
    frontier_rows: list[FrontierRow]  # table `frontiers`
    probe_points: list[frontiers.ProbePoint]  # the capacity searches' probes
    rules: DiagnosisRules  # the rules the stored diagnosis was made with
    study_parts: dict[str, Section]  # the study's parts, in order
    # Run ids of the capacity searches' probes (run.json has a `frontier` block): they are
    # the searches' measurements, shown under Capacity search only, not runs of the study.
    is_probe: frozenset[str]
    # analysis.prefix_cache.counts per run id, for the runs whose schedule had prefix blocks
    prefix_cache: dict[str, PrefixCacheRow]
    published: bool = False  # host names and server command lines left out (runmeta.PRIVATE)

    @property
    def measured(self) -> list[RunRow]:
        """The study's own runs with at least one request (no probe)."""
        return [r for r in self.experiments if r.n_requests]

    @property
    def experiments(self) -> list[RunRow]:
        """The study's own runs: every run but the probes."""
        return [r for r in self.summary if r.run_id not in self.is_probe]

    @property
    def probes(self) -> list[RunRow]:
        return [r for r in self.summary if r.run_id in self.is_probe]

    @property
    def part_of(self) -> dict[str, str | None]:
        """Which part of the study each of its own runs belongs to (its run.json); a probe
        belongs to none, whatever its run.json says."""
        return {run_id: m.part for run_id, m in self.metas.items() if run_id not in self.is_probe}


def load(con: duckdb.DuckDBPyConnection, publish: bool = False) -> ReportData:
    """What the report shows of the database; `publish`: without host names and server
    command lines (filledfirst.contracts.runmeta.PRIVATE), for a page others read."""
    metas = signals.run_metas(con)
    documents = signals.run_meta(con)
    if publish:
        metas = {run_id: runmeta.published(m) for run_id, m in metas.items()}
        documents = {run_id: runmeta.without_private(d) for run_id, d in documents.items()}
    is_probe = frozenset(run_id for run_id, m in metas.items() if m.frontier is not None)
    return ReportData(
        con=con,
        summary=RunRow.of(signals.run_summary(con)),
        roles=RoleRow.of(signals.role_summary(con)),
        metas=metas,
        documents=documents,
        # The diagnosis table exists once `filledfirst diagnose` has run on the database.
        diagnosis=([DiagnosisRow.from_columns(d) for d in con.sql("SELECT * FROM diagnosis").pl().to_dicts()]
                   if table_exists(con, "diagnosis") else []),
        rates={x.run_id: x for x in RunRates.of(signals.run_rates(con))},
        queue_shares={x["run_id"]: x["queue_share"] for x in request_path.queue_shares(con).to_dicts()},
        frontier_rows=frontiers.frontier_rows(con),
        probe_points=frontiers.probe_points(con) if is_probe else [],
        rules=stored_rules(con),
        study_parts=stored_parts(con),
        is_probe=is_probe,
        prefix_cache={x.run_id: x for x in PrefixCacheRow.of(prefix_cache.counts(con)) if x.n_with_ideal},
        published=publish,
    )
