"""`filledfirst frontier run`: capacity searches, each a (frontier, setting), on one server
start: one search, or several that probe the same server one after the other
(filledfirst.config.search_groups), each with its own folder, then the experiments they host,
then the paired checks of their interventions judged side by side alone (filledfirst.run.paired).

With a capacity estimate (the frontier's `estimate` and a max_num_seqs to fill), a closed
loop at the cap runs first (`DIR/estimate`): its completions per second are the search's
first rate (filledfirst.frontier.search). The same closed loop runs after the last probe
(`DIR/check`); the change between the two is the search's drift. Both are ordinary run
folders, not ingested (search.json keeps what they measured: contracts.search.Reference).

An intervention (a setting that relaxes one limit of another, frontier.interventions)
has no closed loops: its first rate is its parent's knee, read from the parent's
search.json beside its folder (`parent_knee`), moved by the shift predicted for it where
`DIR/prediction.json` (`filledfirst frontier predict`) was made from that very parent
search; search.json records what it relaxed and what its first rate was predicted from.

Each probe is an ordinary open-loop run folder (`DIR/p01`, `DIR/p02`, ...: schedule,
requests, tokens, samples, server.log, run.json), made by the runner's `run_on_server`
against one `SharedServer` (started for the first run, reused once idle by the next,
always stopped at the end), so `filledfirst ingest` reads it like any other. Its run.json
carries, beside the usual keys, `experiment` = `<frontier>/<setting>/pNN` and

    frontier: {name, setting, probe, rate, probe_s, offered_rps, slo, target, fingerprint,
               requests, met, attainment, attainment_lo, attainment_hi, backlog_growth,
               verdict, held, lifetime_p90_s, missed: {failed, ttft, itl}, error}

(probe_s: this probe's seconds of arrivals, which grow with its requests' lifetimes and
with the requests its interval needs: frontier.probes.probe_duration; verdict and held
judge this probe alone, frontier.verdict.)

The search's state is a function of its first rate and its probes (frontier.search), so an
interrupted search resumes from the folders: the estimate, if it finished with the same
spec, and the probes that finished (`ok`, with an attainment, the same search fingerprint,
at the rate and length the search asks for next, in probe order); the first probe that did
not, and every folder after it, is measured again. A probe that fails outright (the server
died or never started, every request failed) ends the search (PROBE_FAILED), its reason
kept. At the end `DIR/search.json` is written atomically: the search's settings, its
closed loops, its probes and its result (filledfirst.contracts.search.SearchRecord).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import shutil
import tempfile
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import polars as pl

from filledfirst.contracts import runmeta
from filledfirst.contracts.records import REQUEST_SCHEMA, TOKEN_SCHEMA, to_table
from filledfirst.contracts.runmeta import FrontierProbe, RunMeta, ServerInfo
from filledfirst.contracts.search import (
    PREDICTION_JSON,
    SEARCH_JSON,
    Drift,
    Intervention,
    PredictedStart,
    ProbeRecord,
    Reference,
    ResultRecord,
    SearchBounds,
    SearchRecord,
    Side,
    Slo,
    StopReason,
)
from filledfirst.contracts.stats import ScheduleStats
from filledfirst.engine.shared import SharedServer
from filledfirst.errors import UserError
from filledfirst.frontier.interventions import Span, widened
from filledfirst.frontier.paired import AFTER_PARENT, AFTER_RELAXED
from filledfirst.frontier.plan import FrontierPlan, probe_spec, search_plan
from filledfirst.frontier.probes import offered_rate, synthetic_probe, trace_kept_rate, trace_probe
from filledfirst.frontier.search import CapacitySearch, ProbeOutcome
from filledfirst.frontier.verdict import Verdict, backlog_growth, judge
from filledfirst.interrupts import Interrupted, install_interrupt_handlers, watch_owners
from filledfirst.plan import ExperimentStep
from filledfirst.request_metrics import SLO_ATTAINMENT, SLO_REQUESTS
from filledfirst.run import folder
from filledfirst.run.paired import all_blocks, run_paired
from filledfirst.study import ExperimentSpec, Study, SyntheticWorkload, TraceWorkload, Workload
from filledfirst.trace.formats import Format

log = logging.getLogger(__name__)

_PROBE_DIR = re.compile(r"^p(\d+)$")
# The capacity estimate's closed loop before the search, and the same after it (the drift check).
ESTIMATE, CHECK = "estimate", "check"


def probe_dir_name(probe: int) -> str:
    return f"p{probe:02d}"


def probe_experiment(frontier: str, setting: str, probe: int) -> str:
    return f"{frontier}/{setting}/{probe_dir_name(probe)}"


def probe_attainment(requests, tokens, slo: Slo) -> dict:
    """A probe's evidence from its records: the share that met the SLO
    (filledfirst.request_metrics.SLO_ATTAINMENT, the goodput's own test, run on the
    records in memory), with why the others missed: failed (no first token), TTFT over,
    ITL over (both may count); the p90 lifetime of its ok requests (scheduled arrival to
    end), which sets the length of the probes after it; and the growth of its backlog
    (filledfirst.frontier.verdict.backlog_growth)."""
    con = duckdb.connect()
    try:
        con.register("probe_requests", to_table(requests, REQUEST_SCHEMA))
        con.register("probe_tokens", to_table(tokens, TOKEN_SCHEMA))
        # The records' tables as a run's (one run: the probe).
        con.execute("CREATE VIEW requests AS SELECT 'probe' AS run_id, * FROM probe_requests")
        con.execute("CREATE VIEW tokens AS SELECT 'probe' AS run_id, * FROM probe_tokens")
        row = con.execute(SLO_ATTAINMENT, {"slo_ttft": slo.ttft_ms, "slo_itl": slo.itl_ms}).fetchone()
        waits = con.execute(f"SELECT t_scheduled, ttft_ms FROM ({SLO_REQUESTS})").fetchall()
    finally:
        con.close()
    if row is None:
        return {"requests": 0, "met": 0, "attainment": None, "lifetime_p90_s": None, "backlog_growth": None,
                "missed": {"failed": 0, "ttft": 0, "itl": 0}}
    _, n, met, failed, ttft_over, itl_over, lifetime = row
    growth = backlog_growth([t for t, _ in waits], [math.inf if w is None else w / 1000 for _, w in waits])
    return {"requests": n, "met": met, "attainment": met / n, "lifetime_p90_s": lifetime,
            "backlog_growth": None if growth is None or math.isinf(growth) else growth,
            "backlog_unbounded": growth is not None and math.isinf(growth),
            "missed": {"failed": failed, "ttft": ttft_over, "itl": itl_over}}


def probe_outcome(meta: RunMeta) -> ProbeOutcome:
    """The search's view of a finished probe's run.json."""
    f = meta.frontier
    assert f is not None, f"{meta.run_id}: not a probe"
    if f.error or f.attainment is None:
        return ProbeOutcome.failed(f.rate, f.error or f"no verdict (run status {meta.status})")
    return ProbeOutcome(f.rate, f.attainment, requests=f.requests, growth=f.backlog_growth)


def _verdict(meta: RunMeta, replay, slo: Slo, bounds: SearchBounds) -> dict[str, Any]:
    """The frontier block's measured part (its FrontierProbe fields), filled in before
    run.json is written. `held` and `verdict` judge this probe alone."""
    if meta.status != "ok":
        return {"requests": None, "attainment": None, "held": None, "lifetime_p90_s": None, "missed": None,
                "error": (meta.error or meta.status).strip()}
    # A probe whose every request failed is a failed run already (the runner's rule).
    measured = probe_attainment(replay.requests, replay.tokens, slo)
    unbounded = measured.pop("backlog_unbounded")
    if not measured["requests"]:
        return {**measured, "requests": 0, "attainment": None, "held": None, "error": "no request in the probe"}
    if unbounded:  # the last third's median request never got a first token: the queue ran away
        measured["backlog_growth"] = _UNBOUNDED_GROWTH
    j = judge(measured["met"], measured["requests"], [measured["backlog_growth"]], target=bounds.target,
              confidence=bounds.confidence, max_growth=bounds.backlog_max_growth)
    return {**measured, "attainment_lo": j.attainment_lo, "attainment_hi": j.attainment_hi,
            "verdict": j.verdict.value, "held": j.verdict is Verdict.HELD, "error": None}


# JSON has no infinity: a backlog whose median request of the last third never got a first
# token is recorded as this growth (s/s), beyond any sensible backlog_max_growth.
_UNBOUNDED_GROWTH = 1e9


def reference_throughput(run_dir: Path, concurrency: int) -> tuple[int, float | None]:
    """(ok requests, completions per second after the first `concurrency` completions) of
    a closed loop's run folder: the rate a full batch sustains, its ramp left out."""
    req = pl.read_parquet(Path(run_dir) / folder.REQUESTS).filter(pl.col("status") == "ok")
    done = sorted(req["t_done"].to_list())
    if len(done) <= concurrency or done[-1] <= done[concurrency - 1]:
        return len(done), None
    return len(done), (len(done) - concurrency) / (done[-1] - done[concurrency - 1])


class Prober:
    """Writes probe schedules and measures them on the shared server."""

    def __init__(self, study: Study, plan: FrontierPlan, setting: str, out: Path, fingerprint: str,
                 trace_csv: Path | None, shape_stats: Path | None, progress: bool, before: Prober | None = None):
        """`before`: the prober of the search that ran before this one on the same server
        start (filledfirst.config.search_groups); this one goes on from its server and log."""
        self.study, self.plan, self.setting, self.out, self.progress = study, plan, setting, out, progress
        self.fingerprint = fingerprint
        self.trace_csv = trace_csv
        self.kept_per_s = None
        if isinstance(plan.workload, TraceWorkload):
            if trace_csv is None or shape_stats is None:
                raise UserError(f"frontier {plan.name}: workload {plan.workload_name!r} is a trace: "
                                "give --trace-csv and --shape-stats (its schedule's .stats.json)")
            self.kept_per_s = trace_kept_rate(ScheduleStats.load(shape_stats))
        server = self.probe_spec(plan.name, "", plan.workload).server_spec
        self.server_spec = server
        if before is not None and before.server_spec != server:
            raise UserError(f"{plan.name}/{setting} probes another server than {before.plan.name}/{before.setting}: "
                            "they cannot share a server start")
        self.scratch = Path(tempfile.mkdtemp(prefix=".server-", dir=out))
        self.owns_server = before is None
        # The server's whole log, gone at the end: each probe folder keeps its own part.
        self.shared = before.shared if before is not None else SharedServer(server, self.scratch / folder.SERVER_LOG)
        self.log_from = before.log_from if before is not None else 0

    def probe_spec(self, name: str, description: str, workload: Workload,
                   concurrency: int | None = None) -> ExperimentSpec:
        return probe_spec(self.study, self.plan, self.setting, experiment=name, description=description,
                          workload=workload, concurrency=concurrency)

    def workload(self, rate: float, schedule: Path, probe_s: float) -> tuple[Workload, ScheduleStats]:
        """Write the probe's schedule (and its stats beside it); returns its workload and
        the stats (what it offered: frontier.probes.offered_rate)."""
        wl = self.plan.workload
        if isinstance(wl, SyntheticWorkload):
            from filledfirst.workloads.synthetic import write_synthetic_schedule

            probe = synthetic_probe(wl, rate, probe_s)
            return probe, write_synthetic_schedule(probe, schedule)

        trace = trace_probe(wl, self.kept_per_s, rate, probe_s, self.plan.probe_stretches)
        if len(trace.starts_s) < self.plan.probe_stretches:
            log.info("%s: %.3g s of trace at %.4g req/s cover the %g-minute window: one stretch from its start",
                     self.plan.name, trace.stretch_s, rate, wl.minutes)
        fmt = Format.of(self.study.traces[wl.trace]) if wl.trace in self.study.traces else None
        return trace.workload, trace.write(self.trace_csv, schedule, self.study.model.max_model_len, fmt)

    def measure(self, probe: int, rate: float, probe_s: float | None = None) -> RunMeta:
        """Probe `rate` for `probe_s` seconds of arrivals (the plan's probe_s by default)."""
        from filledfirst.run.runner import run_on_server, spec_meta

        plan, setting = self.plan, self.setting
        name = probe_experiment(plan.name, setting, probe)
        schedule = self.scratch / f"{probe_dir_name(probe)}.parquet"
        probe_s = plan.probe_s if probe_s is None else probe_s
        description = (f"capacity search {plan.name}, setting {setting}: "
                       f"probe {probe} at {rate:.4g} req/s for {probe_s:.3g} s")
        workload, stats = self.workload(rate, schedule, probe_s)
        spec = self.probe_spec(name, description, workload)
        block = FrontierProbe(name=plan.name, setting=setting, probe=probe, rate=rate, probe_s=probe_s,
                              offered_rps=offered_rate(stats, probe_s), slo=plan.slo, target=plan.bounds.target,
                              fingerprint=self.fingerprint)
        about = {**spec_meta(spec.to_doc()), "part": "frontier", "expect": None, "frontier": block,
                 "server": ServerInfo(launcher=spec.engine.launcher, settings=spec.server)}

        def annotate(run_meta: RunMeta, replay) -> None:
            verdict = _verdict(run_meta, replay, plan.slo, plan.bounds)
            run_meta.frontier = msgspec.structs.replace(block, **verdict)

        log.info("%s: probing %.4g req/s for %.3g s (%s)", plan.name + "/" + setting, rate, probe_s, name)
        run_meta, self.log_from = run_on_server(
            self.shared, name, schedule, self.out / probe_dir_name(probe), spec, about,
            progress=self.progress, log_from=self.log_from, annotate=annotate,
        )
        return run_meta

    def reference(self, tag: str, concurrency: int, into: Path | None = None, requests: int | None = None
                  ) -> Reference:
        """The closed loop of the shape at `concurrency` (the estimate before the search,
        the drift check after it, a paired check's block) in `<into>/<tag>` (`into`: this
        search's folder unless given): `requests` (FrontierPlan.reference_requests unless
        given) spread over the shape as a probe's are. A finished folder of the same spec
        is read back instead of measured again."""
        from filledfirst.run.runner import run_on_server, spec_meta

        plan, setting = self.plan, self.setting
        into = self.out if into is None else into
        # named after its folder: a parent's blocks in each of its interventions' folders are apart
        name, out = f"{plan.name}/{into.name}/{tag}", into / tag
        n = plan.reference_requests(concurrency) if requests is None else requests
        schedule = self.scratch / f"{tag}.parquet"
        description = (f"capacity search {plan.name}, setting {setting}: {tag}, a closed loop of {concurrency} "
                       f"({n} requests of the shape)")
        spec = self.probe_spec(name, description, self.workload(n / plan.probe_s, schedule, plan.probe_s)[0],
                               concurrency)
        doc = spec.to_doc()
        meta, why = _read_run(out)
        if meta is not None and (meta.status != "ok" or meta.spec_fingerprint != spec_meta(doc)["spec_fingerprint"]):
            meta, why = None, f"status {meta.status}" if meta.status != "ok" else "measured for another spec"
        if meta is None:
            if out.exists():
                log.info("%s: measuring it again (%s)", out, why)
            about = {**spec_meta(doc), "part": "frontier", "expect": None,
                     "server": ServerInfo(launcher=spec.engine.launcher, settings=spec.server)}
            log.info("%s/%s: %s, a closed loop of %d (%d requests)", plan.name, setting, tag, concurrency, n)
            meta, self.log_from = run_on_server(self.shared, name, schedule, out, spec, about,
                                                progress=self.progress, log_from=self.log_from)
        ok, rps = reference_throughput(out, concurrency) if meta.status == "ok" else (None, None)
        error = None if rps is not None else (meta.error or f"status {meta.status}, {ok} ok requests").strip()
        log.info("%s/%s: %s sustains %s req/s", plan.name, setting, tag, "?" if rps is None else f"{rps:.4g}")
        return Reference(run_dir=tag, run_id=meta.run_id, status=meta.status, concurrency=concurrency, requests=ok,
                         throughput_rps=rps, error=error)

    def close(self) -> None:
        """Stop the server if this prober started it (close the others first: their
        server log is in its scratch), and remove the scratch."""
        if self.owns_server:
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


def _read_run(run_dir: Path) -> tuple[RunMeta | None, str | None]:
    """A run folder's run.json, typed, or why it cannot be read back."""
    try:
        return runmeta.decode(folder.read_run_json(run_dir)), None
    except (folder.IncompleteRunDir, ValueError, FileNotFoundError) as exc:
        return None, f"unfinished ({exc})"


def _read_probe(run_dir: Path) -> tuple[RunMeta | None, str | None]:
    """A probe folder's run.json, typed, or why it cannot be read back."""
    meta, why = _read_run(run_dir)
    if meta is None or meta.frontier is not None:
        return meta, why
    return None, "not a probe (run.json has no frontier block)"


def resume(out: Path, plan: FrontierPlan, setting: str, fp: str, first: float | None = None,
           against: Span | None = None, min_shift: float = 0.0) -> tuple[CapacitySearch, list[ProbeRecord]]:
    """The search (from `first`, a capacity estimate or its parent's knee, if given; an
    intervention's judged `against` its parent's knee) as far as the finished probe
    folders take it; every folder from the first one that cannot be reused on is removed
    (it is measured again)."""
    search = CapacitySearch(plan.bounds, first=first, against=against, min_shift=min_shift)
    records: list[ProbeRecord] = []
    dirs = _probe_dirs(out) if out.is_dir() else {}
    probe = 1
    while probe in dirs:
        meta, why = _read_probe(dirs[probe])
        f = meta.frontier if meta is not None else None
        expected = search.next_rate()
        length = plan.probe_duration(_lifetimes(records), expected) if expected is not None else None
        if why is None:
            assert meta is not None and f is not None
            if meta.status != "ok" or f.attainment is None:
                why = f"status {meta.status}" + (f": {f.error}" if f.error else "")
            elif f.fingerprint != fp or (f.name, f.setting, f.probe) != (plan.name, setting, probe):
                why = "measured for another search (config changed)"
            elif expected is None or not math.isclose(f.rate, expected, rel_tol=1e-9):
                why = f"at {f.rate:g}/s where the search asks for {expected}"
            elif f.probe_s is None or length is None or not math.isclose(f.probe_s, length, rel_tol=1e-9):
                why = f"{f.probe_s} s long where the search asks for {length} s"
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


def probe_to_the_end(prober: Prober, search: CapacitySearch, records: list[ProbeRecord]) -> bool:
    """Probe what the search asks for until it stops, each probe's record appended to
    `records`; whether any probe was measured."""
    measured = False
    while (rate := search.next_rate()) is not None:
        meta = prober.measure(len(search.probes) + 1, rate, prober.plan.probe_duration(_lifetimes(records), rate))
        search.record(probe_outcome(meta))
        records.append(_probe_record(meta, reused=False))
        measured = True
    return measured


def _drift(plan: FrontierPlan, start: Reference | None, end: Reference | None) -> Drift | None:
    if start is None or end is None or not start.throughput_rps or end.throughput_rps is None:
        return None
    change = end.throughput_rps / start.throughput_rps - 1
    return Drift(start_rps=start.throughput_rps, end_rps=end.throughput_rps, change=change,
                 max_change=plan.drift_max, drifted=abs(change) > plan.drift_max)


@dataclass(frozen=True)
class ParentKnee:
    """What an intervention's search starts from: `first`, its first rate (None: its parent
    held nothing, and it grows from `start`); `against`, the parent's knee interval it is
    judged against (None: that search failed); `least_shift`, the least shift that counts
    as a move (its min_shift widened by the parent's drift, as table `frontiers` judges
    it); `predicted`, the prediction `first` came from (None: the parent's knee itself)."""

    first: float | None
    against: Span | None
    least_shift: float
    predicted: PredictedStart | None = None


def parent_knee(out: Path, relaxed: Intervention) -> ParentKnee:
    """An intervention's start, read from its parent's search.json beside its own folder
    and its own prediction.json: the parent's knee (its highest rate that held), moved by
    the predicted shift where the prediction was made from that search and could say."""
    path = Path(out).parent / relaxed.parent / SEARCH_JSON
    try:
        parent = SearchRecord.read(path)
    except FileNotFoundError:
        raise UserError(f"{path}: no search.json; an intervention on {relaxed.parent!r} starts from its knee: "
                        "run that search first") from None
    drift = parent.drift.change if parent.drift else None
    start = ParentKnee(parent.result.lo, Span.of_result(parent.result), widened(relaxed.min_shift, drift))
    try:
        predicted = PredictedStart.read(Path(out) / PREDICTION_JSON)
    except FileNotFoundError:
        return start
    if predicted.parent_fingerprint != parent.fingerprint or predicted.parent_knee_rps != parent.result.lo:
        log.warning("%s: predicted from another search of %s than its search.json: starting at its knee",
                    Path(out) / PREDICTION_JSON, relaxed.parent)
        return start
    if predicted.shift is None or start.first is None:
        log.info("%s: no predicted shift (%s): starting at %s's knee", out, predicted.why, relaxed.parent)
        return start
    return dataclasses.replace(start, first=predicted.start_rps, predicted=predicted)


def _run_hosted(study: Study, hosted: Hosted, records: list[SearchRecord], probers: list[Prober],
                keep_up: bool = False) -> None:
    """The hosted experiments, one after the other, on the searches' server (still running),
    after the last of the searches `probers` ran (`records`, their search.json). The plan
    placed them there: they need exactly that server (filledfirst.plan). `keep_up`: the
    paired checks follow on it."""
    from filledfirst.frontier.relative import KneeFile, load_knees
    from filledfirst.run.runner import Job, run_hosted, warn_unfinished
    from filledfirst.run.schedules import write_workload

    prober = probers[-1]
    knees = {**load_knees(hosted.knees),
             **{r.key: KneeFile(p.out / SEARCH_JSON, r) for r, p in zip(records, probers)}}
    jobs = []
    for step in hosted.runs:
        schedule = prober.scratch / f"{step.experiment}.parquet"
        write_workload(study, step.workload, schedule, knees, None if step.trace_csv is None else Path(step.trace_csv))
        jobs.append(Job(step.experiment, schedule, Path(step.out)))
    log.info("%s: on %s server, %s", ", ".join(r.key for r in records), "its" if len(records) == 1 else "their",
             ", ".join(step.experiment for step in hosted.runs))
    statuses = run_hosted(study, jobs, prober.shared, {s.experiment: s.after_search for s in hosted.runs},
                          prober.log_from, progress=prober.progress, keep_up=keep_up)
    warn_unfinished(jobs, statuses)


@dataclass(frozen=True)
class Hosted:
    """The experiments a search job runs on its server once its searches have ended
    (filledfirst.plan), each with its run folder; their schedules are made then, from the
    job's knees and the `knees` (search.json files) of the others they name."""

    runs: list[ExperimentStep]
    knees: list[Path] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class SearchTask:
    """One capacity search of a job: (frontier, setting), its folder, its identity
    (filledfirst.config.search_fingerprint) and, for a trace workload, the trace's CSV and
    its schedule's stats."""

    frontier: str
    setting: str
    out: Path
    fingerprint: str
    trace_csv: Path | None = None
    shape_stats: Path | None = None


def run_frontier(study: Study, frontier: str, setting: str, out: Path, *, fingerprint: str, progress: bool = True,
                 trace_csv: Path | None = None, shape_stats: Path | None = None) -> SearchRecord:
    """The search of `setting` of `frontier` in the study, to its end; returns its search.json.
    `fingerprint`: the search's identity (filledfirst.config.search_fingerprint)."""
    task = SearchTask(frontier, setting, Path(out), fingerprint, trace_csv, shape_stats)
    return run_searches(study, [task], progress=progress)[0]


def run_searches(study: Study, tasks: list[SearchTask], *, progress: bool = True,
                 hosted: Hosted | None = None, checks: list[SearchTask] | None = None) -> list[SearchRecord]:
    """The searches, one after the other on one server start (they must probe the same
    server: filledfirst.config.search_groups), then the `hosted` experiments on it, then
    the paired `checks` of the interventions of these searches judged side by side alone
    (filledfirst.plan); returns the search.json records of the searches, then the checks'."""
    install_interrupt_handlers()
    watch_owners()
    probers: list[Prober] = []
    records: list[SearchRecord] = []
    try:
        for task in tasks:
            _clean(Path(task.out))
            plan = search_plan(study, task.frontier, task.setting)
            probers.append(Prober(study, plan, task.setting, Path(task.out), task.fingerprint, task.trace_csv,
                                  task.shape_stats, progress, before=probers[-1] if probers else None))
            relaxed = probers[-1].plan.interventions.get(task.setting)
            # judged alone but not in its parent's job (`frontier run` of it): B A A B on its own start
            records.append(search_to_the_end(probers[-1]) if relaxed is None or relaxed.search
                           else unsearched_record(probers[-1], relaxed))
        if hosted is not None and hosted.runs:
            _run_hosted(study, hosted, records, probers, keep_up=bool(checks))
        # Last: a paired check stops the job's server while the other side's runs.
        for i, (task, prober) in enumerate(zip(tasks, probers)):
            relaxed = records[i].intervention
            if relaxed is not None and relaxed.paired and records[i].result.reason is not StopReason.PROBE_FAILED:
                with closing(paired_parent(study, prober, relaxed, task.trace_csv, task.shape_stats)) as parent:
                    records[i] = _paired(task, prober, parent, relaxed, records[i], AFTER_RELAXED)
        for task in checks or []:
            records.append(_judged_alone(study, task, probers, records))
    finally:
        for prober in reversed(probers):  # the server's owner, first, last
            prober.close()
    return records


def _judged_alone(study: Study, task: SearchTask, probers: list[Prober], records: list[SearchRecord]
                  ) -> SearchRecord:
    """The search.json of an intervention judged side by side alone, with its paired check
    against its parent, one of `probers` (this job's searches, their `records`; its server
    may be up). No check after a parent's search that ended on a failed probe; blocks
    measured before the parent's search measured new probes are measured again, as an
    intervention's own search's are."""
    _clean(Path(task.out))
    plan = search_plan(study, task.frontier, task.setting)
    relaxed = plan.interventions[task.setting]
    found = [(p, r) for p, r in zip(probers, records) if (p.plan.name, p.setting) == (task.frontier, relaxed.parent)]
    if not found:
        raise UserError(f"{task.frontier}/{task.setting}: judged side by side with {relaxed.parent!r}, "
                        "which this job does not search")
    parent, searched = found[0]
    with closing(Prober(study, plan, task.setting, Path(task.out), task.fingerprint, task.trace_csv,
                        task.shape_stats, parent.progress)) as prober:
        record = unsearched_record(prober, relaxed)
        if searched.result.reason is StopReason.PROBE_FAILED:
            log.warning("%s/%s: no paired check: %s's search ended on a failed probe", task.frontier, task.setting,
                        relaxed.parent)
            return record
        if any(not p.reused for p in searched.probes):
            for stale in all_blocks(prober.out):
                shutil.rmtree(stale, ignore_errors=True)
        return _paired(task, prober, parent, relaxed, record, AFTER_PARENT)


def paired_parent(study: Study, prober: Prober, relaxed: Intervention, trace_csv: Path | None = None,
                  shape_stats: Path | None = None) -> Prober:
    """The prober of the setting `relaxed` relaxes, for the paired check after the
    intervention's own search (on a server start of its own; the caller closes it)."""
    return Prober(study, search_plan(study, prober.plan.name, relaxed.parent), relaxed.parent, prober.out,
                  prober.fingerprint, trace_csv, shape_stats, prober.progress)


def _paired(task: SearchTask, prober: Prober, parent: Prober, relaxed: Intervention, record: SearchRecord,
            order: tuple[Side, ...]) -> SearchRecord:
    """The intervention's record with its paired check (filledfirst.run.paired) against
    `parent`, in `order`, written again."""
    n = prober.plan.paired_concurrency(task.setting)
    if n is None:
        log.warning("%s/%s: neither it nor %s states max_num_seqs: no closed loop to fill, no paired check",
                    task.frontier, task.setting, relaxed.parent)
        return record
    # the blocks' parts of each server's log begin here (after any later search's or hosted run's)
    for side in (prober, parent):
        side.log_from = side.shared.log_offset()
    record = msgspec.structs.replace(record, paired=run_paired(prober, parent, relaxed, n, order))
    record.write(Path(task.out) / SEARCH_JSON)
    return record


def warn_failed(tasks: list[SearchTask], records: list[SearchRecord]) -> None:
    """A search that ended on a failed probe is a result (search.json says why), so its
    job succeeds and Snakemake keeps its probe folders for the report: said in the log."""
    for task, search in zip(tasks, records):
        if search.result.error:
            log.warning("search %s/%s: a probe failed (%s); see %s/search.json",
                        task.frontier, task.setting, search.result.error.splitlines()[0], task.out)


def _clean(out: Path) -> None:
    """A search folder ready for the search: what a SIGKILL left and the old search.json gone."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob(".server-*"), *out.glob(".p*.partial-*"), *out.glob(".p*.old-*"),
                  *out.glob(f".{ESTIMATE}.*-*"), *out.glob(f".{CHECK}.*-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    (out / SEARCH_JSON).unlink(missing_ok=True)


def _record(prober: Prober, **measured: Any) -> SearchRecord:
    """The search.json of the prober's search, with what it `measured`."""
    plan = prober.plan
    return SearchRecord(
        frontier=plan.name, setting=prober.setting, workload=plan.workload_name, fingerprint=prober.fingerprint,
        slo=plan.slo, probe_s=plan.probe_s, probe_lifetimes=plan.probe_lifetimes, probe_max_s=plan.probe_max_s,
        probe_stretches=plan.probe_stretches, bounds=plan.bounds, **measured)


def unsearched_record(prober: Prober, relaxed: Intervention) -> SearchRecord:
    """The search.json of an intervention its paired check alone judges (interventions.search
    false): no probes, no knee and no first rate. Probe folders of an earlier search of it
    go: no search.json names them any more."""
    for old in prober.out.glob("p[0-9]*"):
        shutil.rmtree(old, ignore_errors=True)
    record = _record(prober, probes=[], result=ResultRecord(lo=None, hi=None, ratio=None,
                                                            reason=StopReason.NOT_SEARCHED, error=None),
                     intervention=relaxed)
    record.write(prober.out / SEARCH_JSON)
    log.info("%s/%s: %s %d -> %d, judged side by side with %s only (interventions.search false)", prober.plan.name,
             prober.setting, relaxed.knob, relaxed.before, relaxed.after, relaxed.parent)
    return record


def search_to_the_end(prober: Prober) -> SearchRecord:
    """The prober's search to its end, its search.json written."""
    plan, setting, out = prober.plan, prober.setting, prober.out
    frontier = plan.name
    relaxed = plan.interventions.get(setting)
    start = parent_knee(out, relaxed) if relaxed is not None else ParentKnee(None, None, 0.0)
    start_rps, against, least_shift = start.first, start.against, start.least_shift
    concurrency = plan.estimate_concurrency(setting)
    estimate = check = None
    try:
        first = start_rps
        if concurrency is not None:
            estimate = prober.reference(ESTIMATE, concurrency)
            first = estimate.throughput_rps
            if first is None:
                log.warning("%s/%s: no capacity estimate (%s): the search grows from %g req/s",
                            frontier, setting, estimate.error, plan.bounds.start)
        elif relaxed is not None:
            knee = "none: it grows from start" if first is None else f"{first:.4g} req/s"
            if start.predicted is not None:
                knee += f", its knee {start.predicted.parent_knee_rps:.4g} req/s {start.predicted.shift:+.0%} predicted"
            log.info("%s/%s: %s %d -> %d, from %s's knee (%s)", frontier, setting, relaxed.knob,
                     relaxed.before, relaxed.after, relaxed.parent, knee)
        elif plan.estimate_batches:
            log.info("%s/%s: no max_num_seqs to fill for a capacity estimate: the search grows from %g req/s",
                     frontier, setting, plan.bounds.start)
        search, records = resume(out, plan, setting, prober.fingerprint, first, against, least_shift)
        # A check measured before these probes would not be the search's end.
        if probe_to_the_end(prober, search, records):
            for after in (out / CHECK, *all_blocks(out)):
                shutil.rmtree(after, ignore_errors=True)
        result = search.result()
        assert result is not None
        if estimate is not None and first is not None and result.reason is not StopReason.PROBE_FAILED:
            check = prober.reference(CHECK, concurrency)
        drift = _drift(plan, estimate, check)
        record = _record(
            prober, probes=records, result=result.record(), estimate=estimate,
            estimate_rps=search.first if estimate is not None and first is not None else None, check=check,
            drift=drift, intervention=relaxed, start_rps=search.first if start_rps is not None else None,
            predicted_start=start.predicted,
        )
        record.write(out / SEARCH_JSON)
        log.info("%s/%s: %s, capacity in [%s, %s) req/s after %d probes%s%s", frontier, setting, result.reason,
                 result.lo, result.hi, len(records), f" ({result.error})" if result.error else "",
                 f"; the server's speed changed {drift.change:+.1%} over the search" if drift else "")
    except Interrupted as exc:  # during a probe (its folder is published) or between probes
        log.error("frontier %s/%s interrupted: %s", frontier, setting, exc.reason)
        raise
    return record
