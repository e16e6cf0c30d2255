"""One experiment, start to finish: server up, schedule replayed, run folder written, server down."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import shutil
import time
import uuid
from pathlib import Path

import polars as pl

from filledfirst import atomic, rundir
from filledfirst.config import experiment_spec, fingerprint
from filledfirst.engine.command import build_command
from filledfirst.engine.lifetime import Interrupted, install_interrupt_handlers, interrupt_reason, watch_owners
from filledfirst.engine.server import ServerStartError, VllmServer, free_port, log_tail
from filledfirst.loadgen.openloop import Replay
from filledfirst.provenance import hardware, versions
from filledfirst.records import REQUEST_SCHEMA, SAMPLE_SCHEMA, TOKEN_SCHEMA, ScheduledRequest, to_table

log = logging.getLogger(__name__)


def read_schedule(path: Path) -> list[ScheduledRequest]:
    df = pl.read_parquet(path)
    return [ScheduledRequest(**row) for row in df.iter_rows(named=True)]


def run_experiment(cfg: dict, experiment: str, schedule_path: Path, out: Path, progress: bool = True) -> str:
    """Returns the run status; the run folder is written whatever happens, then swapped into place."""
    if experiment not in cfg["experiments"]:
        from filledfirst.errors import UserError

        raise UserError(f"experiment {experiment!r} is not in the config ({sorted(cfg['experiments'])})")
    spec = experiment_spec(cfg, experiment)
    schedule = read_schedule(schedule_path)
    out = Path(out)
    work = atomic.make_temp_dir(out)
    shutil.copyfile(schedule_path, work / rundir.SCHEDULE)

    install_interrupt_handlers()
    watch_owners()
    meta: dict = {
        "run_id": f"{experiment}-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}",
        "experiment": experiment,
        "workload": spec["workload_name"],
        "description": spec["description"],
        "spec": spec,
        "spec_fingerprint": fingerprint(spec),
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(),
        "model": spec["model"],
        "versions": versions(),
        "hardware": hardware(),
        "schedule": {"path": str(schedule_path), "requests": len(schedule)},
        "status": "failed",
        "error": None,
        "timings": {},
    }
    stats_path = Path(str(schedule_path) + ".stats.json")
    if stats_path.is_file():
        import json

        meta["schedule"]["stats"] = json.loads(stats_path.read_text())

    engine = spec["engine"]
    host = engine.get("host", "127.0.0.1")
    port = free_port(host)
    cmd = build_command(
        launcher=engine["launcher"],
        model=spec["model"],
        settings=spec["server"],
        host=host,
        port=port,
        seed=engine.get("seed", 0),
        extra_env=engine.get("env", {}),
    )
    meta["server"] = {
        "launcher": engine["launcher"],
        "argv": cmd.argv,
        "env": cmd.env,  # only what we set; API keys never pass through here
        "settings": spec["server"],
        "url": f"http://{host}:{port}",
    }
    replay: Replay | None = None
    t_start = time.monotonic()
    try:
        with VllmServer(
            cmd, host=host, port=port, log_path=work / rundir.SERVER_LOG,
            startup_timeout_s=engine.get("startup_timeout_s", 600),
            nice=engine.get("server_nice", 0),
        ) as server:
            meta["timings"]["startup_s"] = server.startup_s
            meta["versions"]["vllm"] = server.version()
            loadgen = spec["loadgen"]
            replay = Replay(
                schedule,
                base_url=server.base_url,
                model=spec["model"]["name"],
                token_low=spec["model"]["prompt_token_ids"]["low"],
                token_high=spec["model"]["prompt_token_ids"]["high"],
                seed=loadgen.get("seed", 0),
                request_timeout_s=loadgen.get("request_timeout_s", 600),
                drain_timeout_s=loadgen.get("drain_timeout_s", 600),
                scrape_interval_s=spec["scrape"].get("interval_s", 0.25),
                progress=progress,
                server_alive=lambda: server.proc is not None and server.proc.poll() is None,
            )
            log.info("replaying %d requests against %s", len(schedule), server.base_url)
            asyncio.run(replay.run())
            meta["timings"]["replay_s"] = replay.t_end
            meta["timings"]["client_cpu_s"] = replay.client_cpu_s
            if replay.server_died:
                meta["status"] = "partial"
                meta["error"] = "vLLM exited during the run. Last lines of server.log:\n" + log_tail(
                    work / rundir.SERVER_LOG
                )
            elif replay.interrupted:
                meta["status"], meta["error"] = "partial", f"interrupted: {replay.interrupted}"
            else:
                meta["status"] = "ok"
    except ServerStartError as exc:
        meta["status"], meta["error"] = "failed", str(exc)
        log.error("%s", exc)
    except Interrupted as exc:
        meta["status"] = "partial" if replay is not None else "failed"
        meta["error"] = f"interrupted: {exc.reason}"
    finally:
        meta["duration_s"] = time.monotonic() - t_start
        meta["finished_at"] = dt.datetime.now(dt.timezone.utc).isoformat()
        _write_run_folder(work, out, meta, replay)
    log.info("run %s: %s -> %s", meta["run_id"], meta["status"], out)
    if interrupt_reason():
        raise SystemExit(130)  # the pipeline must see an interrupted job as not done
    return meta["status"]


def _write_run_folder(work: Path, out: Path, meta: dict, replay: Replay | None) -> None:
    if replay is not None:
        atomic.write_parquet(to_table(replay.requests, REQUEST_SCHEMA), work / rundir.REQUESTS)
        atomic.write_parquet(to_table(replay.tokens, TOKEN_SCHEMA), work / rundir.TOKENS)
        atomic.write_parquet(to_table(replay.scraper.samples, SAMPLE_SCHEMA), work / rundir.SAMPLES)
        counts: dict[str, int] = {}
        for r in replay.requests:
            counts[r.status] = counts.get(r.status, 0) + 1
        meta["request_status_counts"] = counts
        meta["scrape_errors"] = replay.scraper.errors
    # run.json last: its presence is what marks the folder complete.
    atomic.write_json(meta, work / rundir.RUN_JSON)
    atomic.publish_dir(work, out)
