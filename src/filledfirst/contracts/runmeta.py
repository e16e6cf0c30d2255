"""run.json, typed: the contract between a run folder and everything that reads it.

The runner builds a `RunMeta` as the run goes and writes it once (`RunMeta.write`);
ingest decodes it once (refusing a folder whose run.json does not fit) and lifts its key
facts into columns of table `runs` (`RUN_COLUMNS`) for SQL; the diagnosis and the report
read the typed record (signals.run_metas), so nothing downstream walks the document by
string paths. The whole document stays in `runs.meta` for the report's setup dumps.
Unknown keys are allowed: a newer runner may add some, and an older run folder lacks the
newer ones (None, or their defaults here).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
from msgspec import UNSET

from filledfirst import atomic, redact
from filledfirst.contracts.document import Document, Opt, settled
from filledfirst.contracts.search import Probe, Slo
from filledfirst.contracts.stats import ScheduleStats
from filledfirst.schema import schema_default


class ModelInfo(Document):
    """The config's model section as the run used it (filledfirst.study.Model); a replay
    against someone else's endpoint knows its name alone."""

    name: Opt[str] = UNSET
    source: Opt[str] = UNSET
    dtype: Opt[str] = UNSET
    max_model_len: Opt[int] = UNSET
    prompt_token_ids: Opt[dict[str, int]] = UNSET
    path: Opt[str] = UNSET
    revision: Opt[str] = UNSET
    download_to: Opt[str] = UNSET
    load_format: Opt[str] = UNSET
    tiny: Opt[dict[str, Any]] = UNSET


class ServerInfo(Document):
    """The server the run got: the vLLM settings it was started with (or an endpoint's url),
    its command and environment (redacted), which experiment started it, and the group of
    experiments sharing it."""

    launcher: str | None = None
    settings: dict[str, Any] = {}
    argv: Opt[list[str]] = UNSET
    env: Opt[dict[str, str]] = UNSET
    url: Opt[str] = UNSET
    api_key_env: Opt[str] = UNSET  # the variable's name only, never the key
    shared_with: Opt[list[str]] = UNSET
    group_position: Opt[int] = UNSET  # 1 = the first experiment of the group
    warmed_up_by: Opt[str] = UNSET
    started_by: Opt[str] = UNSET
    # `<frontier>/<setting>`: the capacity search whose server it ran on, after its probes
    after_search: Opt[str] = UNSET
    # the per-step token budget as the engine logged it (RunMeta.token_budget falls back
    # to the setting)
    max_num_batched_tokens: Opt[int] = UNSET


class ScheduleInfo(Document):
    path: str | None = None
    requests: int | None = None
    stats: Opt[ScheduleStats] = UNSET


class FrontierProbe(Probe, kw_only=True):
    """A capacity-search probe's block (filledfirst.run.search): which search, its SLO and
    target, and the probe's verdict with why its requests missed."""

    name: str
    setting: str
    slo: Slo | None = None
    target: float | None = None
    fingerprint: str | None = None  # the search's (filledfirst.config.search_fingerprint)
    missed: dict[str, int] | None = None  # failed, ttft, itl; None: the probe failed outright


class Scrape(msgspec.Struct, kw_only=True, frozen=True):
    """How often /metrics is read: the config's `scrape` section (filledfirst.study), and
    what a run scraped at."""

    interval_s: float = schema_default("scrape", "interval_s")


class Timings(Document):
    startup_s: Opt[float] = UNSET  # the server start this run paid for
    startup_reused_s: Opt[float] = UNSET  # a start an earlier run paid for
    idle_wait_s: Opt[float] = UNSET  # waited for the reused server to be idle
    replay_s: Opt[float] = UNSET
    client_cpu_s: Opt[float] = UNSET  # the load generator's processes (client and scraper), all of them
    client_cpu_peak_s: Opt[float] = UNSET  # the busiest of them (one process: the same)
    client_workers: Opt[int] = UNSET  # processes that sent requests


class KvShape(Document):
    """The model's KV per token, from its config.json when the run started (filledfirst.model.kv)."""

    elements_per_token: float | None = None
    config_dtype: str | None = None
    why: str | None = None


class RunMeta(Document):
    """run.json. The runner builds it as the run goes and writes it once (`write`); readers
    get it from `decode`, `read` or `from_row`, with every key the writer left out None.
    `spec` is the experiment's spec document as the config made it
    (filledfirst.study.ExperimentSpec), which `spec_fingerprint` hashes; `versions` and
    `hardware` are provenance (filledfirst.run.provenance)."""

    run_id: str
    experiment: str
    status: str
    error: str | None = None
    workload: str | None = None
    description: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    duration_s: float | None = None
    # Report-only: which table of the study and which pattern the experiment was designed
    # for; outside the spec, so relabelling never re-runs an experiment.
    part: Opt[str] = UNSET
    expect: Opt[str] = UNSET
    spec: Opt[dict[str, Any]] = UNSET
    spec_fingerprint: Opt[str] = UNSET
    model: ModelInfo = msgspec.field(default_factory=ModelInfo)
    server: ServerInfo = msgspec.field(default_factory=ServerInfo)
    scrape: Opt[Scrape] = UNSET
    schedule: ScheduleInfo = msgspec.field(default_factory=ScheduleInfo)
    frontier: Opt[FrontierProbe] = UNSET
    kv: KvShape | None = None
    timings: Timings = msgspec.field(default_factory=Timings)
    versions: dict[str, Any] = {}
    hardware: dict[str, Any] = {}
    request_status_counts: Opt[dict[str, int]] = UNSET
    scrape_errors: Opt[int] = UNSET

    def _spec(self, section: str, key: str) -> Any:
        return ((self.spec or {}).get(section) or {}).get(key)

    @property
    def closed_loop(self) -> bool:
        mode = self._spec("loadgen", "mode")
        if mode is not None:
            return mode == "closed"
        # An external replay does not record --closed; a schedule whose arrivals are all
        # at one instant is what the closed-loop sweep replays.
        stats = self.schedule.stats
        return stats is not None and stats.duration_s == 0 and (stats.requests or 0) > 1

    @property
    def load_mode(self) -> str:
        return "closed" if self.closed_loop else "open"

    @property
    def concurrency(self) -> int | None:
        """A closed loop's requests in flight, as the spec asked."""
        return self._spec("loadgen", "concurrency")

    @property
    def max_num_seqs(self) -> int | None:
        """The cap the server ran with: as started, else as the spec asked."""
        value = self.server.settings.get("max_num_seqs", self._spec("server", "max_num_seqs"))
        return int(value) if value is not None else None

    @property
    def max_num_active_seqs(self) -> int | None:
        """The admission cap below max_num_seqs the server ran with, where it had one."""
        value = self.server.settings.get("max_num_active_seqs", self._spec("server", "max_num_active_seqs"))
        return int(value) if value is not None else None

    @property
    def token_budget(self) -> int | None:
        """The per-step token budget the server ran with: as it said, else as started,
        else as the spec asked."""
        for value in (self.server.max_num_batched_tokens, self.server.settings.get("max_num_batched_tokens"),
                      self._spec("server", "max_num_batched_tokens")):
            if value not in (None, UNSET):
                return int(value)
        return None

    @property
    def scrape_interval_s(self) -> float | None:
        return (self.scrape.interval_s if self.scrape else None) or self._spec("scrape", "interval_s")

    def write(self, path, known: set[str] = frozenset()) -> RunMeta:
        """Write run.json with the secrets in `known`, and those its own fields hold (the
        server's command, environment and URL), redacted wherever they were copied (an
        error quoting the server's log); returns the record as written."""
        doc = self.to_doc()
        doc = redact.redact_document(doc, set(known) | redact.secrets_in(doc))
        atomic.write_json(doc, path)
        return decode(doc)


# Sections a runner may have written as null: the same as absent.
_SECTIONS = ("model", "server", "schedule", "timings", "versions", "hardware")


def decode(doc: dict) -> RunMeta:
    """A run.json document (already parsed) as RunMeta; a ValueError names what is wrong."""
    doc = {k: v for k, v in doc.items() if not (v is None and k in _SECTIONS)}
    try:
        return settled(msgspec.convert(doc, RunMeta))
    except msgspec.ValidationError as exc:
        raise ValueError(f"run.json: {exc}") from None


def loads(text: str | bytes) -> dict[str, Any]:
    """A run.json's text as its document: for what keeps or shows it whole (table
    `runs`, the report's setup dumps); everything else reads `decode`'s record."""
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError(f"run.json: expected an object, got {type(doc).__name__}")
    return doc


def from_row(run_id: str, experiment: str, status: str, text: str | bytes | None) -> RunMeta:
    """A row of table `runs` as RunMeta: its `meta` document, the row's own id, experiment
    and status where the document lacks them (a database written by hand or by tests)."""
    doc = loads(text) if text else {}
    return decode({"experiment": experiment, "status": status, **doc, "run_id": run_id})


def unknown(run_id: str) -> RunMeta:
    """What is known of a run that is not in table `runs`: nothing but its id."""
    return settled(RunMeta(run_id=run_id, experiment="", status=""))


# What a published page leaves out of run.json (`report.publish`): where the study ran (host
# and node names, an endpoint's address) and how its servers were started (command lines,
# which carry local paths).
PRIVATE = ("hardware.host", "hardware.batch_job.node", "server.argv", "server.url", "spec.server.url",
           "spec.engine.host")


def without_private(doc: dict[str, Any]) -> dict[str, Any]:
    """The document without its PRIVATE keys (a copy: the stored one is left whole)."""
    out = json.loads(json.dumps(doc))
    for key in PRIVATE:
        *path, last = key.split(".")
        node: Any = out
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return out


def published(meta: RunMeta) -> RunMeta:
    """The record without what a published page leaves out (PRIVATE)."""
    return decode(without_private(msgspec.to_builtins(meta)))


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
        "concurrency": meta.concurrency,
        "frontier": f.name if f else None,
        "frontier_setting": f.setting if f else None,
        "frontier_probe": f.probe if f else None,
        "frontier_rate_rps": f.rate if f else None,
        "replay_s": meta.timings.replay_s,
        "client_cpu_s": meta.timings.client_cpu_s,
        "client_cpu_peak_s": meta.timings.client_cpu_peak_s,
        "client_workers": meta.timings.client_workers,
    }
