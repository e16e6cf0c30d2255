"""One measured run, start to finish, written to a run folder whatever happens.

`run_experiments`: start vLLM once for experiments of the config that share its
settings, replay each in turn, stop it (`run_experiment`: the same for one).
`replay_endpoint`: replay against a server someone else runs (bring your own endpoint).
`run_on_server`: one run against a server the caller keeps (the capacity search's probes).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import msgspec
from msgspec import UNSET

from filledfirst import atomic, redact
from filledfirst.config import check_shareable, experiment_spec, external_server, spec_document, spec_fingerprint
from filledfirst.contracts.records import REQUEST_SCHEMA, SAMPLE_SCHEMA, TOKEN_SCHEMA, ScheduledRequest, to_table
from filledfirst.contracts.runmeta import KvShape, ModelInfo, RunMeta, ScheduleInfo, Scrape, ServerInfo
from filledfirst.contracts.stats import ScheduleStats, stats_path
from filledfirst.engine.server import ServerStartError, log_excerpt, server_version
from filledfirst.engine.shared import SharedServer
from filledfirst.errors import UserError
from filledfirst.interrupts import Interrupted, install_interrupt_handlers, interrupt_reason, watch_owners
from filledfirst.loadgen import loop as event_loop
from filledfirst.loadgen.endpoint import EndpointError, check_endpoint
from filledfirst.loadgen.fdlimit import client_fault
from filledfirst.loadgen.replay import Replay
from filledfirst.loadgen.settings import ReplaySettings
from filledfirst.model.kv import kv_record
from filledfirst.run import folder, kept
from filledfirst.run.provenance import hardware, versions
from filledfirst.schedule import load_schedule
from filledfirst.study import Experiment, ExperimentSpec, Study

log = logging.getLogger(__name__)


def read_schedule(path: Path) -> list[ScheduledRequest]:
    return load_schedule(path)


class _Run:
    """The run folder under construction and its run.json, filled in as the run goes.
    `about`: the RunMeta fields the caller knows (workload, spec, model, server, ...)."""

    def __init__(self, name: str, schedule_path: Path, out: Path, about: dict[str, Any]):
        self.schedule = read_schedule(schedule_path)
        self.out = Path(out)
        self.work = atomic.make_temp_dir(self.out)
        shutil.copyfile(schedule_path, self.work / folder.SCHEDULE)
        self.replay: Replay | None = None
        # Secrets the run was handed (the API key, the server's command and environment),
        # to find again in what is written: an error quoting the server's log, an answer.
        self.known: set[str] = set()
        self.t_start = time.monotonic()
        stats = stats_path(schedule_path)
        self.meta = RunMeta(
            run_id=f"{name}-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}",
            experiment=name,
            started_at=dt.datetime.now(dt.timezone.utc).isoformat(),
            versions=versions(),
            hardware=hardware(),
            schedule=ScheduleInfo(path=str(schedule_path), requests=len(self.schedule),
                                  stats=ScheduleStats.load(stats, as_written=True) if stats.is_file() else UNSET),
            status="failed",
            error=None,
            **about,
        )
        # The model folder is at hand now: the diagnosis reads its KV shape from here.
        self.meta.kv = KvShape(**kv_record(self.meta.model.to_doc()))

    def replay_against(
        self, base_url: str, settings: ReplaySettings, progress: bool,
        server_alive: Callable[[], bool] | None, server_log: Path | None = None,
    ) -> None:
        """The replay; the run is `ok` when it ran to its end and at least one request
        succeeded (a run whose every sent request failed is `failed`, with the commonest error)."""
        self.replay = Replay(self.schedule, base_url, settings, progress=progress, server_alive=server_alive)
        self.known.update(filter(None, [settings.api_key]))
        # The diagnosis holds a scraped value for a multiple of this, also for external replays.
        self.meta.scrape = Scrape(interval_s=settings.scrape_interval_s)
        log.info("replaying %d requests against %s", len(self.schedule), base_url)
        event_loop.run(self.replay.run())
        timings = self.meta.timings
        timings.replay_s = self.replay.t_end
        timings.client_cpu_s = self.replay.client_cpu_s
        timings.client_cpu_peak_s = self.replay.client_cpu_peak_s
        timings.client_workers = self.replay.workers
        if self.replay.server_died:
            assert server_log is not None  # only a server we started is watched
            self.outcome("partial", "vLLM exited during the run. " + log_excerpt(server_log))
        elif (why := client_fault(self.replay.requests)) is not None:  # ours, not the server's
            self.outcome("failed", why)
        elif self.replay.interrupted:
            self.outcome("partial", f"interrupted: {self.replay.interrupted}")
        elif (why := every_request_failed(self.replay.requests)) is not None:
            self.outcome("failed", why)
        else:
            self.meta.status = "ok"

    def outcome(self, status: str, error: str) -> None:
        self.meta.status, self.meta.error = status, error

    def interrupted(self, exc: Interrupted) -> None:
        self.outcome("partial" if self.replay is not None else "failed", f"interrupted: {exc.reason}")

    def finish(self) -> str:
        """Write the folder and swap it into place; an interrupted run raises `Interrupted`
        afterwards (the CLI exits 130 for it). What is written and logged is redacted
        (filledfirst.redact): the secrets in the server's command, environment and URL,
        wherever they were copied (an error quoting the server's log), are not in it."""
        self.meta.duration_s = time.monotonic() - self.t_start
        self.meta.finished_at = dt.datetime.now(dt.timezone.utc).isoformat()
        if self.replay is not None:
            r = self.replay
            known = self.known | redact.secrets_in(self.meta.to_doc())
            for rec in r.requests:  # a server's error text may quote what it was sent
                if rec.error:
                    rec.error = redact.redact_text(rec.error, known)
            atomic.write_parquet(to_table(r.requests, REQUEST_SCHEMA), self.work / folder.REQUESTS)
            atomic.write_parquet(to_table(r.tokens, TOKEN_SCHEMA), self.work / folder.TOKENS)
            atomic.write_parquet(to_table(r.scraper.samples, SAMPLE_SCHEMA), self.work / folder.SAMPLES)
            self.meta.request_status_counts = dict(Counter(rec.status for rec in r.requests))
            self.meta.scrape_errors = r.scraper.errors
        # run.json last: its presence is what marks the folder complete.
        meta = self.meta = self.meta.write(self.work / folder.RUN_JSON, self.known)
        atomic.publish_dir(self.work, self.out)
        if meta.status == "ok":
            log.info("run %s: ok -> %s", meta.run_id, self.out)
        else:
            why = (meta.error or "no error recorded").strip().splitlines()[0]
            log.warning("run %s: %s (%s) -> %s", meta.run_id, meta.status, why, self.out)
        if reason := interrupt_reason():
            raise Interrupted(reason)  # the pipeline must see an interrupted job as not done
        return meta.status


def every_request_failed(requests) -> str | None:
    """Why a run whose every sent request failed is not a result to read latencies from
    (one line: the statuses and the commonest error), or None when one succeeded or none
    was sent."""
    sent = [r for r in requests if r.status != "not_sent"]
    if not sent or any(r.status == "ok" for r in sent):
        return None
    statuses = Counter(r.status for r in sent)
    errors = Counter(((r.error or "").strip().splitlines() or [r.status])[0][:300] for r in sent)
    error, n = errors.most_common(1)[0]
    return (f"every request failed ({', '.join(f'{k} {s}' for s, k in statuses.most_common())} of {len(sent)} sent); "
            f"commonest error ({n} of {len(sent)}): {error}")


@dataclass(frozen=True)
class Job:
    """One experiment of a `filledfirst run` call and where its run folder goes."""

    experiment: str
    schedule: Path
    out: Path


def warn_unfinished(jobs: list[Job], statuses: list[str]) -> None:
    """A failed or partial run is a result: its folder says why and the report lists it, so
    its job succeeds and Snakemake keeps the folders (an interrupt raises Interrupted
    instead: exit 130, and the job is redone). Said in the log."""
    for job, status in zip(jobs, statuses):
        if status != "ok":
            log.warning("experiment %s: %s (see %s/run.json); the folder is kept for the report. "
                        "To run it again, delete the folder or use snakemake --forcerun.",
                        job.experiment, status, job.out)


def run_experiment(study: Study, experiment: str, schedule_path: Path, out: Path, progress: bool = True) -> str:
    """Returns the run status; the run folder is written whatever happens, then swapped into place."""
    return run_experiments(study, [Job(experiment, Path(schedule_path), Path(out))], progress)[0]


def run_experiments(study: Study, jobs: list[Job], progress: bool = True) -> list[str]:
    """Experiments with identical server settings, in the given order, against one server
    start. Each run folder is published as soon as its experiment ends; an interruption
    publishes the current one and raises `Interrupted` without starting the rest."""
    check_shareable(study, [job.experiment for job in jobs])
    if len({job.out.resolve() for job in jobs}) < len(jobs):
        raise UserError(f"two experiments would write the same run folder: {[str(job.out) for job in jobs]}")
    install_interrupt_handlers()
    watch_owners()
    if (external := external_server(study, jobs[0].experiment)) is not None:
        return [_run_against_endpoint(study, jobs[0], external, progress)]
    parent = jobs[0].out.parent
    parent.mkdir(parents=True, exist_ok=True)
    # The server's whole log, beside the run folders (same file system), gone at the end:
    # each run folder keeps its own part.
    scratch = Path(tempfile.mkdtemp(prefix=f".{jobs[0].experiment}.server-", dir=parent))
    shared = SharedServer(experiment_spec(study, jobs[0].experiment).server_spec, scratch / folder.SERVER_LOG)
    group = _Group(study, jobs, shared)
    try:
        statuses = [group.run(position, progress) for position in range(len(jobs))]
    finally:
        group.shared.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    kept.forget([job.out for job in jobs])  # every folder is in place: the job is done
    return statuses


def run_hosted(study: Study, jobs: list[Job], shared: SharedServer, searches: dict[str, str],
               log_from: int, progress: bool = True, keep_up: bool = False) -> list[str]:
    """Experiments on the server of the capacity searches that host them (`searches`:
    experiment -> `<frontier>/<setting>`, filledfirst.config.hosted_experiments), once those
    have ended, as a server group's: their parts of the server's log begin at byte
    `log_from`. The caller stops the server; the last of them does unless `keep_up` (more
    follows on it: the paired checks)."""
    for job in jobs:
        job.out.parent.mkdir(parents=True, exist_ok=True)
    group = _Group(study, jobs, shared, after_search=searches, keep_up=keep_up)
    group.log_from = log_from
    statuses = [group.run(position, progress) for position in range(len(jobs))]
    kept.forget([job.out for job in jobs])
    return statuses


class _Group:
    """The experiments of one call and the server they share, run one after the other."""

    def __init__(self, study: Study, jobs: list[Job], shared: SharedServer,
                 after_search: dict[str, str] | None = None, keep_up: bool = False):
        self.after_search = after_search or {}  # experiment -> the capacity search whose server this is
        self.keep_up = keep_up  # the server serves more after the last experiment
        self.study = study
        self.jobs = jobs
        self.names = [job.experiment for job in jobs]
        self.shared = shared
        # Where the next run's part of the server log begins: the parts are contiguous, so
        # what the server wrote between two experiments is in the later one's log.
        self.log_from = 0
        self.restored: set[int] = set()  # positions taken from an interrupted attempt

    def run(self, position: int, progress: bool) -> str:
        job = self.jobs[position]
        doc = spec_document(self.study, job.experiment)
        spec = ExperimentSpec.from_doc(doc)
        keeping = len(self.jobs) > 1  # a lone experiment has no finished sibling to lose
        if keeping and (reused := kept.restore(job.out, spec_fingerprint(doc), job.schedule)) is not None:
            self.restored.add(position)
            return reused.status
        # In an uninterrupted run this experiment met a server that had just served the one
        # before it; a restored one was not served by this start, so it is replayed first.
        warmed_by = _warm_up(self, self.jobs[position - 1], progress) if position - 1 in self.restored else None
        exp = self.study.experiments[job.experiment]
        run = _Run(job.experiment, job.schedule, job.out, _experiment_meta(exp, doc, ServerInfo(
            launcher=spec.engine.launcher, settings=spec.server, shared_with=self.names, group_position=position + 1,
            **({"after_search": self.after_search[job.experiment]} if job.experiment in self.after_search else {}),
        )))
        shared = self.shared
        try:
            waited = shared.ready(job.experiment)
            _record_server(run, shared, waited)
            if warmed_by is not None and waited is not None:
                run.meta.server.warmed_up_by = warmed_by
            run.replay_against(
                shared.base_url, _settings_for(spec, shared), progress,
                server_alive=shared.alive, server_log=shared.log_path,
            )
            self._stop_if_done(position, run)  # here, so a signal while stopping is handled below
        except ServerStartError as exc:
            _record_server(run, shared, None)
            run.outcome("failed", str(exc))
            # An experiment failed by an earlier start's failure gets that start's log too.
            self.log_from = min(self.log_from, shared.start_offset)
            log.error("%s", redact.redact_text(str(exc), shared.secrets))
        except Interrupted as exc:
            run.interrupted(exc)
        finally:
            self._stop_if_done(position, run)  # once stopping, signals no longer interrupt this
            self.log_from = shared.copy_log(self.log_from, run.work / folder.SERVER_LOG)
            status = run.finish()
        if keeping and status == "ok":
            kept.keep(job.out)
        return status

    def _stop_if_done(self, position: int, run: _Run) -> None:
        """The server's last run gets its shutdown lines in its log (unless the server is
        kept up for what follows); a server that died is stopped (its whole group) before
        the next experiment starts a fresh one."""
        if (position == len(self.jobs) - 1 and not self.keep_up) or run.meta.status != "ok" or interrupt_reason():
            self.shared.stop()


def _settings_for(spec: ExperimentSpec, shared: SharedServer) -> ReplaySettings:
    """The replay's settings against a server we started: with the API key it was started
    with (`--api-key` in `extra_args`, or VLLM_API_KEY), which it wants on every request."""
    settings = ReplaySettings.from_spec(spec)
    if shared.cmd is not None:
        settings.api_key = shared.cmd.api_key()
    return settings


def _warm_up(group: _Group, job: Job, progress: bool) -> str | None:
    """Replay a restored experiment's schedule on the group's server without recording it,
    so the next experiment meets the server as it would have without the interruption.
    Returns the experiment's name, or None when the warm-up could not run (the next
    experiment then meets a fresh server, as its run.json shows)."""
    log.info("%s: replaying it unrecorded, so the next experiment meets a server that has just served it",
             job.experiment)
    spec = ExperimentSpec.from_doc(spec_document(group.study, job.experiment))
    try:
        group.shared.ready(job.experiment)
        replay = Replay(read_schedule(job.schedule), group.shared.base_url, _settings_for(spec, group.shared),
                        progress=progress, server_alive=group.shared.alive)
        event_loop.run(replay.run())
    except ServerStartError:
        return None  # the next experiment's own start fails the same way, with the reason
    if reason := interrupt_reason():
        raise Interrupted(reason)
    if replay.server_died or replay.interrupted:
        return None
    return job.experiment


def run_on_server(
    shared: SharedServer, name: str, schedule_path: Path, out: Path, spec: ExperimentSpec, about: dict[str, Any], *,
    progress: bool = True, log_from: int = 0,
    annotate: Callable[[RunMeta, Replay | None], None] | None = None,
) -> tuple[RunMeta, int]:
    """One ordinary run folder against a server the caller keeps between runs (the
    capacity search's probes): the server made ready (started, or reused once idle), the
    replay, its part of the server log from byte `log_from`, then `annotate(run.json,
    replay)` completes run.json before it is written (`about`: as for _Run).
    A server that died or failed to start is stopped; the caller stops it at the end.
    Returns (run.json, where the next run's log part begins); an interruption publishes the
    folder and raises `Interrupted`, as group runs do."""
    run = _Run(name, schedule_path, out, about)
    try:
        waited = shared.ready(name)
        _record_server(run, shared, waited)
        run.replay_against(
            shared.base_url, _settings_for(spec, shared), progress,
            server_alive=shared.alive, server_log=shared.log_path,
        )
        if run.meta.status != "ok" or interrupt_reason():
            shared.stop()
    except ServerStartError as exc:
        _record_server(run, shared, None)
        run.outcome("failed", str(exc))
        log_from = min(log_from, shared.start_offset)
        log.error("%s", redact.redact_text(str(exc), shared.secrets))
    except Interrupted as exc:
        run.interrupted(exc)
    finally:
        if run.meta.status != "ok" or interrupt_reason():
            shared.stop()
        log_from = shared.copy_log(log_from, run.work / folder.SERVER_LOG)
        if annotate is not None:
            try:
                annotate(run.meta, run.replay)
            except Exception:  # the folder is still written: what was measured is kept
                log.exception("could not annotate run %s", run.meta.run_id)
        run.finish()
    return run.meta, log_from


def _experiment_meta(exp: Experiment, spec: dict, server: ServerInfo) -> dict[str, Any]:
    """run.json's fields but for what the run measures; `spec` as spec_document wrote it."""
    return {**spec_meta(spec), "part": exp.section, "expect": exp.expect, "server": server}


def spec_meta(spec: dict[str, Any]) -> dict[str, Any]:
    """The RunMeta fields an experiment's (or a probe's) spec document decides."""
    typed = ExperimentSpec.from_doc(spec)
    return {"workload": typed.workload_name, "description": typed.description, "spec": spec,
            "spec_fingerprint": spec_fingerprint(spec), "model": msgspec.convert(spec["model"], ModelInfo)}


def _run_against_endpoint(study: Study, job: Job, external: dict, progress: bool) -> str:
    """An experiment whose server someone else runs: nothing to start or stop."""
    doc = spec_document(study, job.experiment)
    settings = ReplaySettings.from_spec(ExperimentSpec.from_doc(doc))
    stated = study.experiments[job.experiment].external
    assert stated is not None  # external_server found its url
    key_env = stated.api_key_env
    settings.api_key = _api_key(key_env, f"experiments.{job.experiment}.server.api_key_env")
    url = _without_credentials(stated.url)
    # The variable's name only: the key itself never reaches run.json, logs or DuckDB.
    server = ServerInfo(launcher="external", url=url, api_key_env=key_env, settings=stated.limits)
    run = _Run(job.experiment, job.schedule, job.out, _experiment_meta(study.experiments[job.experiment], doc, server))
    try:
        check_endpoint(url, settings.api_key)
    except EndpointError as exc:
        # Like a server that did not start: a failed run folder, kept for the report.
        run.outcome("failed", str(exc))
        return run.finish()
    return _replay_external(run, url, settings, progress)


def _without_credentials(url: str) -> str:
    """The endpoint's URL without a user and password: the replay authenticates with the
    API key alone (its requests never sent a URL's credentials; aiohttp, which scrapes
    /metrics, would send them as basic auth and refuses them beside the key's header)."""
    url = url.rstrip("/")
    if (bare := redact.redact_url(url)) != url:
        log.warning("%s: the user and password in the URL are not sent; the replay authenticates with the API "
                    "key only (--api-key-env, server.api_key_env)", bare)
    return bare


def _api_key(env_name: str | None, where: str) -> str | None:
    if not env_name:
        return None
    key = os.environ.get(env_name)
    if not key:
        raise UserError(f"{where}: the environment variable {env_name} is not set")
    return key


def _replay_external(run: _Run, url: str, settings: ReplaySettings, progress: bool) -> str:
    try:
        run.meta.versions["vllm"] = server_version(url)
        run.replay_against(url, settings, progress, server_alive=None)
    except Interrupted as exc:
        run.interrupted(exc)
    finally:
        status = run.finish()
    return status


def _record_server(run: _Run, shared: SharedServer, waited: float | None) -> None:
    """The server this run got; its start-up is under `startup_s` only for the run that
    paid it, the others see what they reused as `startup_reused_s`."""
    meta = run.meta
    run.known |= shared.secrets  # to find again in an error quoting the server's log
    if shared.cmd is not None:
        meta.server.argv = redact.redact_argv(shared.cmd.argv)
        meta.server.env = redact.redact_env(shared.cmd.env)  # only what we set
        meta.server.url = shared.base_url
    if not shared.alive():
        return  # it never became healthy
    meta.server.started_by = shared.started_by
    if shared.token_budget is not None:
        meta.server.max_num_batched_tokens = shared.token_budget
    meta.versions["vllm"] = shared.version
    if waited is None:
        meta.timings.startup_s = shared.startup_s
    else:
        meta.timings.startup_reused_s = shared.startup_s
        meta.timings.idle_wait_s = waited


def replay_endpoint(
    url: str, schedule_path: Path, out: Path, settings: ReplaySettings, *,
    name: str = "replay", api_key_env: str | None = None, progress: bool = True, limits: dict[str, int] | None = None,
) -> str:
    """Replay a schedule against a running OpenAI-compatible server; /metrics is scraped there.
    An endpoint that cannot be reached or refuses the key raises EndpointError before
    anything is written; a run whose every request failed returns `failed`. `limits`: the
    server's limits as its owner states them (filledfirst.study.ExternalServer.limits)."""
    url = _without_credentials(url)
    settings.api_key = _api_key(api_key_env, f"--api-key-env {api_key_env}")
    check_endpoint(url, settings.api_key)  # nothing measured, no run folder: the caller fixes the URL or key
    install_interrupt_handlers()
    run = _Run(name, schedule_path, out, {
        "workload": Path(schedule_path).stem,
        "description": f"replay against {url}",
        "model": ModelInfo(name=settings.model),
        # The variable's name only: the key itself never reaches run.json, logs or DuckDB.
        "server": ServerInfo(launcher="external", url=url, api_key_env=api_key_env, settings=dict(limits or {})),
    })
    return _replay_external(run, url, settings, progress)
