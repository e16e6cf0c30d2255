"""run.json, typed: the contract between a run folder and everything that reads it.

The runner writes run.json; ingest decodes it once into `RunMeta` (refusing a folder
whose run.json does not fit) and lifts its key facts into columns of table `runs`
(`RUN_COLUMNS`) for SQL; the diagnosis and the report read the typed record
(signals.run_metas), so nothing downstream walks the document by string paths. The whole document stays in `runs.meta`
for the report's setup dumps. Unknown keys are allowed: a newer runner may add some, and
an older run folder lacks the newer ones (their defaults here).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec


class _Part(msgspec.Struct, kw_only=True, frozen=True):
    pass


class ModelInfo(_Part):
    name: str | None = None
    path: str | None = None
    dtype: str | None = None
    source: str | None = None


class ServerInfo(_Part):
    launcher: str | None = None
    settings: dict[str, Any] = {}
    argv: list[str] = []
    url: str | None = None


class LoadgenSpec(_Part):
    mode: str | None = None  # None: not recorded (an external replay's run.json)
    concurrency: int | None = None


class RunSpec(_Part):
    loadgen: LoadgenSpec = LoadgenSpec()
    server: dict[str, Any] = {}
    scrape: dict[str, Any] = {}


class ScheduleInfo(_Part):
    path: str | None = None
    requests: int | None = None
    stats: dict[str, Any] | None = None


class FrontierProbe(_Part):
    """A capacity-search probe's block (filledfirst.run.search)."""

    name: str
    setting: str
    probe: int
    rate: float
    probe_s: float | None = None
    slo: dict[str, float] = {}
    target: float | None = None
    fingerprint: str | None = None
    requests: int | None = None
    attainment: float | None = None
    held: bool | None = None
    lifetime_p90_s: float | None = None  # its ok requests' scheduled arrival to end, p90
    missed: dict[str, int] | None = None  # None: the probe failed outright
    error: str | None = None


class Scrape(_Part):
    interval_s: float | None = None


class Timings(_Part):
    startup_s: float | None = None
    replay_s: float | None = None
    client_cpu_s: float | None = None  # the load generator's processes (client and scraper), all of them
    client_cpu_peak_s: float | None = None  # the busiest of them (one process: the same)
    client_workers: int | None = None  # processes that sent requests


class KvShape(_Part):
    """The model's KV per token, from its config.json when the run started (filledfirst.model.kv)."""

    elements_per_token: float | None = None
    config_dtype: str | None = None
    why: str | None = None


class RunMeta(_Part):
    run_id: str
    experiment: str
    status: str
    workload: str | None = None
    description: str | None = None
    error: str | None = None
    started_at: str | None = None
    duration_s: float | None = None
    part: str | None = None
    expect: str | None = None
    model: ModelInfo = ModelInfo()
    server: ServerInfo = ServerInfo()
    spec: RunSpec = RunSpec()
    scrape: Scrape = Scrape()
    schedule: ScheduleInfo = ScheduleInfo()
    frontier: FrontierProbe | None = None
    kv: KvShape | None = None
    timings: Timings = Timings()
    versions: dict[str, Any] = {}

    @property
    def closed_loop(self) -> bool:
        if self.spec.loadgen.mode is not None:
            return self.spec.loadgen.mode == "closed"
        # An external replay does not record --closed; a schedule whose arrivals are all
        # at one instant is what the closed-loop sweep replays.
        stats = self.schedule.stats or {}
        return stats.get("duration_s") == 0 and (stats.get("requests") or 0) > 1

    @property
    def load_mode(self) -> str:
        return "closed" if self.closed_loop else "open"

    @property
    def max_num_seqs(self) -> int | None:
        """The cap the server ran with: as started, else as the spec asked."""
        value = self.server.settings.get("max_num_seqs", self.spec.server.get("max_num_seqs"))
        return int(value) if value is not None else None

    @property
    def scrape_interval_s(self) -> float | None:
        return self.scrape.interval_s or self.spec.scrape.get("interval_s")


# Sections a runner may have written as null: the same as absent.
_SECTIONS = ("model", "server", "spec", "scrape", "schedule", "timings", "versions")


def decode(doc: dict) -> RunMeta:
    """A run.json document (already parsed) as RunMeta; a ValueError names what is wrong."""
    doc = {k: v for k, v in doc.items() if not (v is None and k in _SECTIONS)}
    try:
        return msgspec.convert(doc, RunMeta)
    except msgspec.ValidationError as exc:
        raise ValueError(f"run.json: {exc}") from None


def from_row(run_id: str, experiment: str, status: str, text: str | bytes | None) -> RunMeta:
    """A row of table `runs` as RunMeta: its `meta` document, the row's own id, experiment
    and status where the document lacks them (a database written by hand or by tests)."""
    doc = json.loads(text) if text else {}
    return decode({"experiment": experiment, "status": status, **doc, "run_id": run_id})


def unknown(run_id: str) -> RunMeta:
    """What is known of a run that is not in table `runs`: nothing but its id."""
    return RunMeta(run_id=run_id, experiment="", status="")


# Columns of table `runs` lifted from run.json at ingest, beside the older ones (name ->
# SQL type, value): what diagnosis and report select instead of opening the document.
RUN_COLUMNS: dict[str, str] = {
    "part": "VARCHAR",
    "expect": "VARCHAR",
    "load_mode": "VARCHAR",
    "concurrency": "BIGINT",
    "frontier": "VARCHAR",
    "frontier_setting": "VARCHAR",
    "frontier_probe": "BIGINT",
    "frontier_rate_rps": "DOUBLE",
    "replay_s": "DOUBLE",
    "client_cpu_s": "DOUBLE",
    "client_cpu_peak_s": "DOUBLE",
    "client_workers": "BIGINT",
}


def run_columns(meta: RunMeta) -> dict[str, Any]:
    f = meta.frontier
    return {
        "part": meta.part,
        "expect": meta.expect,
        "load_mode": meta.load_mode,
        "concurrency": meta.spec.loadgen.concurrency,
        "frontier": f.name if f else None,
        "frontier_setting": f.setting if f else None,
        "frontier_probe": f.probe if f else None,
        "frontier_rate_rps": f.rate if f else None,
        "replay_s": meta.timings.replay_s,
        "client_cpu_s": meta.timings.client_cpu_s,
        "client_cpu_peak_s": meta.timings.client_cpu_peak_s,
        "client_workers": meta.timings.client_workers,
    }
