"""One measured run, start to finish, written to a run folder whatever happens.

`run_experiment`: start vLLM for an experiment of the config, replay, stop it.
`replay_endpoint`: replay against a server someone else runs (bring your own endpoint).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import os
import shutil
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Callable

import polars as pl

from filledfirst import atomic, rundir
from filledfirst.config import experiment_spec, fingerprint
from filledfirst.engine.command import build_command
from filledfirst.engine.lifetime import Interrupted, install_interrupt_handlers, interrupt_reason, watch_owners
from filledfirst.engine.server import ServerStartError, VllmServer, free_port, log_tail
from filledfirst.errors import UserError
from filledfirst.loadgen.replay import Replay
from filledfirst.loadgen.settings import ReplaySettings
from filledfirst.provenance import hardware, versions
from filledfirst.records import REQUEST_SCHEMA, SAMPLE_SCHEMA, TOKEN_SCHEMA, ScheduledRequest, to_table

log = logging.getLogger(__name__)


def read_schedule(path: Path) -> list[ScheduledRequest]:
    df = pl.read_parquet(path)
    return [ScheduledRequest(**row) for row in df.iter_rows(named=True)]


class _Run:
    """The run folder under construction and the metadata that ends up in run.json."""

    def __init__(self, name: str, schedule_path: Path, out: Path, extra: dict):
        self.schedule = read_schedule(schedule_path)
        self.out = Path(out)
        self.work = atomic.make_temp_dir(self.out)
        shutil.copyfile(schedule_path, self.work / rundir.SCHEDULE)
        self.replay: Replay | None = None
        self.t_start = time.monotonic()
        self.meta: dict = {
            "run_id": f"{name}-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}",
            "experiment": name,
            "started_at": dt.datetime.now(dt.timezone.utc).isoformat(),
            "versions": versions(),
            "hardware": hardware(),
            "schedule": {"path": str(schedule_path), "requests": len(self.schedule)},
            "status": "failed",
            "error": None,
            "timings": {},
            **extra,
        }
        stats = Path(str(schedule_path) + ".stats.json")
        if stats.is_file():
            self.meta["schedule"]["stats"] = json.loads(stats.read_text())

    def replay_against(
        self, base_url: str, settings: ReplaySettings, progress: bool, server_alive: Callable[[], bool] | None
    ) -> None:
        self.replay = Replay(self.schedule, base_url, settings, progress=progress, server_alive=server_alive)
        log.info("replaying %d requests against %s", len(self.schedule), base_url)
        asyncio.run(self.replay.run())
        self.meta["timings"]["replay_s"] = self.replay.t_end
        self.meta["timings"]["client_cpu_s"] = self.replay.client_cpu_s
        if self.replay.server_died:
            self.meta["status"] = "partial"
            self.meta["error"] = "vLLM exited during the run. Last lines of server.log:\n" + log_tail(
                self.work / rundir.SERVER_LOG
            )
        elif self.replay.interrupted:
            self.meta["status"], self.meta["error"] = "partial", f"interrupted: {self.replay.interrupted}"
        else:
            self.meta["status"] = "ok"

    def interrupted(self, exc: Interrupted) -> None:
        self.meta["status"] = "partial" if self.replay is not None else "failed"
        self.meta["error"] = f"interrupted: {exc.reason}"

    def finish(self) -> str:
        """Write the folder and swap it into place; an interrupted run exits 130 afterwards."""
        meta = self.meta
        meta["duration_s"] = time.monotonic() - self.t_start
        meta["finished_at"] = dt.datetime.now(dt.timezone.utc).isoformat()
        if self.replay is not None:
            r = self.replay
            atomic.write_parquet(to_table(r.requests, REQUEST_SCHEMA), self.work / rundir.REQUESTS)
            atomic.write_parquet(to_table(r.tokens, TOKEN_SCHEMA), self.work / rundir.TOKENS)
            atomic.write_parquet(to_table(r.scraper.samples, SAMPLE_SCHEMA), self.work / rundir.SAMPLES)
            meta["request_status_counts"] = dict(Counter(rec.status for rec in r.requests))
            meta["scrape_errors"] = r.scraper.errors
        # run.json last: its presence is what marks the folder complete.
        atomic.write_json(meta, self.work / rundir.RUN_JSON)
        atomic.publish_dir(self.work, self.out)
        log.info("run %s: %s -> %s", meta["run_id"], meta["status"], self.out)
        if interrupt_reason():
            raise SystemExit(130)  # the pipeline must see an interrupted job as not done
        return meta["status"]


def run_experiment(cfg: dict, experiment: str, schedule_path: Path, out: Path, progress: bool = True) -> str:
    """Returns the run status; the run folder is written whatever happens, then swapped into place."""
    if experiment not in cfg["experiments"]:
        raise UserError(f"experiment {experiment!r} is not in the config ({sorted(cfg['experiments'])})")
    spec = experiment_spec(cfg, experiment)
    engine = spec["engine"]
    host = engine.get("host", "127.0.0.1")
    port = free_port(host)
    cmd = build_command(
        launcher=engine["launcher"], model=spec["model"], settings=spec["server"],
        host=host, port=port, seed=engine.get("seed", 0), extra_env=engine.get("env", {}),
    )
    install_interrupt_handlers()
    watch_owners()
    run = _Run(experiment, schedule_path, out, {
        "workload": spec["workload_name"],
        "description": spec["description"],
        "spec": spec,
        "spec_fingerprint": fingerprint(spec),
        "model": spec["model"],
        "server": {
            "launcher": engine["launcher"],
            "argv": cmd.argv,
            "env": cmd.env,  # only what we set; API keys never pass through here
            "settings": spec["server"],
            "url": f"http://{host}:{port}",
        },
    })
    try:
        with VllmServer(
            cmd, host=host, port=port, log_path=run.work / rundir.SERVER_LOG,
            startup_timeout_s=engine.get("startup_timeout_s", 600),
            nice=engine.get("server_nice", 0),
        ) as server:
            run.meta["timings"]["startup_s"] = server.startup_s
            run.meta["versions"]["vllm"] = server.version()
            run.replay_against(
                server.base_url, ReplaySettings.from_spec(spec), progress,
                server_alive=lambda: server.proc is not None and server.proc.poll() is None,
            )
    except ServerStartError as exc:
        run.meta["status"], run.meta["error"] = "failed", str(exc)
        log.error("%s", exc)
    except Interrupted as exc:
        run.interrupted(exc)
    finally:
        status = run.finish()
    return status


def replay_endpoint(
    url: str, schedule_path: Path, out: Path, settings: ReplaySettings, *,
    name: str = "replay", api_key_env: str | None = None, progress: bool = True,
) -> str:
    """Replay a schedule against a running OpenAI-compatible server; /metrics is scraped there."""
    url = url.rstrip("/")
    if api_key_env:
        settings.api_key = os.environ.get(api_key_env)
        if not settings.api_key:
            raise UserError(f"--api-key-env {api_key_env}: that environment variable is not set")
    install_interrupt_handlers()
    run = _Run(name, schedule_path, out, {
        "workload": Path(schedule_path).stem,
        "description": f"replay against {url}",
        "model": {"name": settings.model},
        # The variable's name only: the key itself never reaches run.json, logs or DuckDB.
        "server": {"launcher": "external", "url": url, "api_key_env": api_key_env, "settings": {}},
    })
    try:
        run.meta["versions"]["vllm"] = _server_version(url)
        run.replay_against(url, settings, progress, server_alive=None)
    except Interrupted as exc:
        run.interrupted(exc)
    finally:
        status = run.finish()
    return status


def _server_version(url: str) -> str | None:
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/version", timeout=5) as resp:
            return json.loads(resp.read())["version"]
    except Exception:  # not vLLM, or no /version: the run goes on without it
        return None
