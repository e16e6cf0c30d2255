"""`filledfirst frontier run`: one capacity search, (frontier, setting), on one server start.

Each probe is an ordinary open-loop run folder (`DIR/p01`, `DIR/p02`, ...: schedule,
requests, tokens, samples, server.log, run.json), made by the runner's `run_on_server`
against one `SharedServer` (started for the first probe, reused once idle by the next,
always stopped at the end), so `filledfirst ingest` reads it like any other. Its run.json
carries, beside the usual keys, `experiment` = `<frontier>/<setting>/pNN` and

    frontier: {name, setting, probe, rate, probe_s, slo, target, fingerprint,
               requests, attainment, held, lifetime_p90_s, missed: {failed, ttft, itl}, error}

(probe_s: this probe's seconds of arrivals, which grow with its requests' lifetimes:
frontier.probes.probe_duration.)

The search's state is a function of its probes alone (frontier.search), so an interrupted
search resumes from the probe folders: those that finished (`ok`, with an attainment, the
same search fingerprint, at the rate and length the search asks for next, in probe order) are read
back; the first one that did not, and every folder after it, is measured again. A probe
that fails outright (the server died or never started, every request failed) ends the
search (PROBE_FAILED), its reason kept. At the end `DIR/search.json` is written atomically:
the search's settings, its probes and its result (filledfirst.contracts.search.SearchRecord).
"""

from __future__ import annotations

import logging
import math
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import duckdb
import msgspec

from filledfirst.contracts import runmeta
from filledfirst.contracts.records import REQUEST_SCHEMA, TOKEN_SCHEMA, to_table
from filledfirst.contracts.runmeta import FrontierProbe, RunMeta, ServerInfo
from filledfirst.contracts.search import SEARCH_JSON, ProbeRecord, SearchRecord, Slo
from filledfirst.contracts.stats import ScheduleStats
from filledfirst.engine.shared import SharedServer
from filledfirst.errors import UserError
from filledfirst.frontier.plan import FrontierPlan, probe_spec, search_plan
from filledfirst.frontier.probes import synthetic_probe, trace_kept_rate, trace_probe
from filledfirst.frontier.search import CapacitySearch, ProbeOutcome
from filledfirst.interrupts import Interrupted, install_interrupt_handlers, watch_owners
from filledfirst.request_metrics import SLO_ATTAINMENT
from filledfirst.run import folder
from filledfirst.study import ExperimentSpec, Study, SyntheticWorkload, TraceWorkload, Workload

log = logging.getLogger(__name__)

_PROBE_DIR = re.compile(r"^p(\d+)$")


def probe_dir_name(probe: int) -> str:
    return f"p{probe:02d}"


def probe_experiment(frontier: str, setting: str, probe: int) -> str:
    return f"{frontier}/{setting}/{probe_dir_name(probe)}"


def probe_attainment(requests, tokens, slo: Slo) -> dict:
    """A probe's verdict from its records: the share that met the SLO
    (filledfirst.request_metrics.SLO_ATTAINMENT, the goodput's own test, run on the
    records in memory), with why the others missed: failed (no first token), TTFT over,
    ITL over (both may count), and the p90 lifetime of its ok requests (scheduled arrival
    to end), which sets the length of the probes after it."""
    con = duckdb.connect()
    try:
        con.register("probe_requests", to_table(requests, REQUEST_SCHEMA))
        con.register("probe_tokens", to_table(tokens, TOKEN_SCHEMA))
        # The records' tables as a run's (one run: the probe).
        con.execute("CREATE VIEW requests AS SELECT 'probe' AS run_id, * FROM probe_requests")
        con.execute("CREATE VIEW tokens AS SELECT 'probe' AS run_id, * FROM probe_tokens")
        row = con.execute(SLO_ATTAINMENT, {"slo_ttft": slo.ttft_ms, "slo_itl": slo.itl_ms}).fetchone()
    finally:
        con.close()
    if row is None:
        return {"requests": 0, "attainment": None, "lifetime_p90_s": None,
                "missed": {"failed": 0, "ttft": 0, "itl": 0}}
    _, n, met, failed, ttft_over, itl_over, lifetime = row
    return {"requests": n, "attainment": met / n, "lifetime_p90_s": lifetime,
            "missed": {"failed": failed, "ttft": ttft_over, "itl": itl_over}}


def probe_outcome(meta: RunMeta) -> ProbeOutcome:
    """The search's view of a finished probe's run.json."""
    f = meta.frontier
    assert f is not None, f"{meta.run_id}: not a probe"
    if f.error or f.attainment is None:
        return ProbeOutcome.failed(f.rate, f.error or f"no verdict (run status {meta.status})")
    return ProbeOutcome(f.rate, f.attainment)


def _verdict(meta: RunMeta, replay, slo: Slo, target: float) -> dict[str, Any]:
    """The frontier block's measured part (its FrontierProbe fields), filled in before
    run.json is written."""
    if meta.status != "ok":
        return {"requests": None, "attainment": None, "held": None, "lifetime_p90_s": None, "missed": None,
                "error": (meta.error or meta.status).strip()}
    # A probe whose every request failed is a failed run already (the runner's rule).
    measured = probe_attainment(replay.requests, replay.tokens, slo)
    if not measured["requests"]:
        return {**measured, "requests": 0, "attainment": None, "held": None, "error": "no request in the probe"}
    return {**measured, "held": measured["attainment"] >= target, "error": None}


class Prober:
    """Writes probe schedules and measures them on the shared server."""

    def __init__(self, study: Study, plan: FrontierPlan, setting: str, out: Path, fingerprint: str,
                 trace_csv: Path | None, shape_stats: Path | None, progress: bool):
        self.study, self.plan, self.setting, self.out, self.progress = study, plan, setting, out, progress
        self.fingerprint = fingerprint
        self.trace_csv = trace_csv
        self.kept_per_s = None
        if isinstance(plan.workload, TraceWorkload):
            if trace_csv is None or shape_stats is None:
                raise UserError(f"frontier {plan.name}: workload {plan.workload_name!r} is a trace: "
                                "give --trace-csv and --shape-stats (its schedule's .stats.json)")
            self.kept_per_s = trace_kept_rate(ScheduleStats.load(shape_stats))
        self.scratch = Path(tempfile.mkdtemp(prefix=".server-", dir=out))
        # The server's whole log, gone at the end: each probe folder keeps its own part.
        server = self.probe_spec(plan.name, "", plan.workload).server_spec
        self.shared = SharedServer(server, self.scratch / folder.SERVER_LOG)
        self.log_from = 0

    def probe_spec(self, name: str, description: str, workload: Workload) -> ExperimentSpec:
        return probe_spec(self.study, self.plan, self.setting, experiment=name, description=description,
                          workload=workload)

    def workload(self, rate: float, schedule: Path, probe_s: float) -> Workload:
        """Write the probe's schedule (and its stats beside it); returns its workload."""
        wl = self.plan.workload
        if isinstance(wl, SyntheticWorkload):
            from filledfirst.workloads.synthetic import write_synthetic_schedule

            probe = synthetic_probe(wl, rate, probe_s)
            write_synthetic_schedule(probe, schedule)
            return probe
        from filledfirst.trace.subsample import subsample_to_parquet, window_of

        probe = trace_probe(wl, self.kept_per_s, rate, probe_s)
        subsample_to_parquet(self.trace_csv, schedule, **window_of(probe), time_scale=float(probe.time_scale),
                             max_model_len=self.study.model.max_model_len)
        return probe

    def measure(self, probe: int, rate: float, probe_s: float | None = None) -> RunMeta:
        """Probe `rate` for `probe_s` seconds of arrivals (the plan's probe_s by default)."""
        from filledfirst.run.runner import run_on_server, spec_meta

        plan, setting = self.plan, self.setting
        name = probe_experiment(plan.name, setting, probe)
        schedule = self.scratch / f"{probe_dir_name(probe)}.parquet"
        probe_s = plan.probe_s if probe_s is None else probe_s
        description = (f"capacity search {plan.name}, setting {setting}: "
                       f"probe {probe} at {rate:.4g} req/s for {probe_s:.3g} s")
        spec = self.probe_spec(name, description, self.workload(rate, schedule, probe_s))
        block = FrontierProbe(name=plan.name, setting=setting, probe=probe, rate=rate, probe_s=probe_s, slo=plan.slo,
                              target=plan.bounds.target, fingerprint=self.fingerprint)
        about = {**spec_meta(spec.to_doc()), "part": "frontier", "expect": None, "frontier": block,
                 "server": ServerInfo(launcher=spec.engine.launcher, settings=spec.server)}

        def annotate(run_meta: RunMeta, replay) -> None:
            verdict = _verdict(run_meta, replay, plan.slo, plan.bounds.target)
            run_meta.frontier = msgspec.structs.replace(block, **verdict)

        log.info("%s: probing %.4g req/s for %.3g s (%s)", plan.name + "/" + setting, rate, probe_s, name)
        run_meta, self.log_from = run_on_server(
            self.shared, name, schedule, self.out / probe_dir_name(probe), spec, about,
            progress=self.progress, log_from=self.log_from, annotate=annotate,
        )
        return run_meta

    def close(self) -> None:
        self.shared.stop()
        shutil.rmtree(self.scratch, ignore_errors=True)


def _probe_record(meta: RunMeta, reused: bool) -> ProbeRecord:
    f = meta.frontier
    assert f is not None, f"{meta.run_id}: not a probe"
    return ProbeRecord.of(f, run_dir=probe_dir_name(f.probe), run_id=meta.run_id, status=meta.status, reused=reused)


def _lifetimes(records: list[ProbeRecord]) -> list[tuple[float, bool | None, float | None]]:
    """What the next probe's length depends on (FrontierPlan.probe_duration)."""
    return [(r.rate, r.held, r.lifetime_p90_s) for r in records]


def _probe_dirs(out: Path) -> dict[int, Path]:
    return {int(m.group(1)): p for p in out.iterdir() if (m := _PROBE_DIR.match(p.name)) and p.is_dir()}


def _read_probe(run_dir: Path) -> tuple[RunMeta | None, str | None]:
    """A probe folder's run.json, typed, or why it cannot be read back."""
    try:
        meta = runmeta.decode(folder.read_run_json(run_dir))
    except (folder.IncompleteRunDir, ValueError) as exc:
        return None, f"unfinished ({exc})"
    return (meta, None) if meta.frontier is not None else (None, "not a probe (run.json has no frontier block)")


def resume(out: Path, plan: FrontierPlan, setting: str, fp: str) -> tuple[CapacitySearch, list[ProbeRecord]]:
    """The search as far as the finished probe folders take it; every folder from the
    first one that cannot be reused on is removed (it is measured again)."""
    search = CapacitySearch(plan.bounds)
    records: list[ProbeRecord] = []
    dirs = _probe_dirs(out) if out.is_dir() else {}
    probe = 1
    while probe in dirs:
        meta, why = _read_probe(dirs[probe])
        f = meta.frontier if meta is not None else None
        expected = search.next_rate()
        length = plan.probe_duration(_lifetimes(records))
        if why is None:
            assert meta is not None and f is not None
            if meta.status != "ok" or f.attainment is None:
                why = f"status {meta.status}" + (f": {f.error}" if f.error else "")
            elif f.fingerprint != fp or (f.name, f.setting, f.probe) != (plan.name, setting, probe):
                why = "measured for another search (config changed)"
            elif expected is None or not math.isclose(f.rate, expected, rel_tol=1e-9):
                why = f"at {f.rate:g}/s where the search asks for {expected}"
            elif f.probe_s is None or not math.isclose(f.probe_s, length, rel_tol=1e-9):
                why = f"{f.probe_s} s long where the search asks for {length:g} s"
        if why is not None:
            log.info("%s: measuring probe %d again (%s)", out, probe, why)
            break
        search.record(probe_outcome(meta))
        records.append(_probe_record(meta, reused=True))
        log.info("%s: reusing probe %d at %.4g req/s (attainment %.3f)", out, probe, f.rate, f.attainment)
        probe += 1
    for n, path in dirs.items():
        if n >= probe:
            shutil.rmtree(path)
    return search, records


def run_frontier(study: Study, frontier: str, setting: str, out: Path, *, fingerprint: str, progress: bool = True,
                 trace_csv: Path | None = None, shape_stats: Path | None = None) -> SearchRecord:
    """The search of `setting` of `frontier` in the study, to its end; returns its search.json.
    `fingerprint`: the search's identity (filledfirst.config.search_fingerprint)."""
    plan = search_plan(study, frontier, setting)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob(".server-*"), *out.glob(".p*.partial-*"), *out.glob(".p*.old-*")]:
        shutil.rmtree(stale, ignore_errors=True)  # left by a SIGKILL
    (out / SEARCH_JSON).unlink(missing_ok=True)
    install_interrupt_handlers()
    watch_owners()
    prober = Prober(study, plan, setting, out, fingerprint, trace_csv, shape_stats, progress)
    try:
        search, records = resume(out, plan, setting, prober.fingerprint)
        while (rate := search.next_rate()) is not None:
            meta = prober.measure(len(search.probes) + 1, rate, plan.probe_duration(_lifetimes(records)))
            search.record(probe_outcome(meta))
            records.append(_probe_record(meta, reused=False))
    except Interrupted as exc:  # during a probe (its folder is published) or between probes
        log.error("frontier %s/%s interrupted: %s", frontier, setting, exc.reason)
        raise
    finally:
        prober.close()
    result = search.result()
    assert result is not None
    record = SearchRecord(
        frontier=frontier, setting=setting, workload=plan.workload_name, fingerprint=prober.fingerprint,
        slo=plan.slo, probe_s=plan.probe_s, probe_lifetimes=plan.probe_lifetimes, probe_max_s=plan.probe_max_s,
        bounds=plan.bounds, probes=records, result=result.record(),
    )
    record.write(out / SEARCH_JSON)
    log.info("%s/%s: %s, capacity in [%s, %s) req/s after %d probes%s", frontier, setting, result.reason,
             result.lo, result.hi, len(records), f" ({result.error})" if result.error else "")
    return record
