"""The study config as types: converted once, after the schema has validated the dict.

Defaults live in exactly one place each:
- a key whose schema entry has `default:` (src/filledfirst/schemas/config.schema.yaml) takes it
  from there: the fields below read it with `schema_default` (filledfirst.schema), so
  Snakemake (which fills the schema's defaults into its `config` dict) and this module
  cannot disagree; the sections the run's files carry too (`scrape`, a frontier's `slo`)
  are the contracts' types (filledfirst.contracts), under the same rule;
- a key the schema cannot give a default (the workload kinds are a `oneOf`, whose
  branches must not fill defaults) has it here, on its field, and the schema only
  describes it.
tests/config/test_study.py checks that every schema default is a field default here and that
no other field default hides a second one.

`Study.from_dict` is the one conversion; `filledfirst.config.load_study` loads, merges,
validates and converts.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Callable, Literal, Mapping, NamedTuple

import msgspec

from filledfirst.contracts.runmeta import Scrape
from filledfirst.contracts.search import Slo
from filledfirst.errors import UserError
from filledfirst.schema import schema_default


# Keys a config may no longer use, each with what replaces it: refused, never read as the
# new one (filledfirst.config checks them before the schema does). A path's "*" is any name,
# "[]" any item of a list; `when` narrows it to values of one form (a relative rate).
class Renamed(NamedTuple):
    path: tuple[str, ...]
    new: str
    when: Callable[[Any], bool] = lambda value: True


RENAMED: tuple[Renamed, ...] = (
    Renamed(("frontiers", "*", "verify"), "interventions: {settings: [...], factor: N}"),
    Renamed(("frontiers", "*", "verify_factor"), "interventions: {settings: [...], factor: N}"),
    Renamed(("frontiers", "*", "verify_min_shift"), "interventions: {settings: [...], min_shift: X}"),
    Renamed(("workloads", "*", "phases", "[]", "interval_s"), "rate: {of: <frontier>/<setting>, times: X}",
            lambda value: isinstance(value, Mapping)),
    Renamed(("workloads", "*", "time_scale"), "rate: {of: <frontier>/<setting>, times: X}",
            lambda value: isinstance(value, Mapping)),
    Renamed(("parts",), "sections: (the report's sections)"),
    Renamed(("experiments", "*", "part"), "section: <a name in sections>"),
    Renamed(("experiments", "*", "isolate"), "share_server: false (a server of its own)"),
    Renamed(("share_search_servers",), "share_server: true|false (whether runs of one server share its start)"),
)


def renamed_keys(cfg: Mapping[str, Any]) -> list[str]:
    """Each old key the config uses, as `<key path>: renamed; write <the new one>`."""
    out = []
    for rule in RENAMED:
        for where, value in _at(cfg, rule.path, ()):
            if rule.when(value):
                out.append(f"{'.'.join(where)}: renamed; write {rule.new}")
    return out


def _at(node: Any, path: tuple[str, ...], where: tuple[str, ...]):
    """(key path, value) of every place `path` matches under `node`."""
    if not path:
        yield where, node
        return
    head, rest = path[0], path[1:]
    if head == "[]":
        items = enumerate(node) if isinstance(node, list) else ()
        for i, item in items:
            yield from _at(item, rest, (*where[:-1], f"{where[-1]}[{i}]") if where else (f"[{i}]",))
    elif isinstance(node, Mapping):
        keys = list(node) if head == "*" else [head] if head in node else []
        for key in keys:
            yield from _at(node[key], rest, (*where, str(key)))


def _d(*path: str) -> Any:
    return schema_default(*path)


class _Struct(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    pass


class StudyInfo(_Struct):
    name: str
    description: str = ""


class TokenIds(_Struct):
    low: int
    high: int


class TinyShape(_Struct):
    layers: int | None = None
    hidden_size: int | None = None


# Where `filledfirst model fetch` puts a hub model unless model.download_to says otherwise.
MODELS_DIR = "data/models"


def model_folder(model: Mapping[str, Any]) -> str | None:
    """The folder a model's weights are served from (the config's model section, or
    run.json's): its own folder (source tiny or path), or the one a hub model is fetched
    into once before any server starts (download_to, else data/models/<name>)."""
    if model.get("source") == "hub":
        return model.get("download_to") or f"{MODELS_DIR}/{model['name']}"
    return model.get("path")


class Model(_Struct):
    name: str
    source: Literal["tiny", "path", "hub"]
    dtype: str
    max_model_len: int
    prompt_token_ids: TokenIds
    path: str | None = None  # a folder (tiny, path) or the hub id (hub)
    revision: str | None = None  # of a hub model: a branch, tag or commit (None: the hub's default branch)
    download_to: str | None = None  # where a hub model is fetched to (model_folder)
    load_format: str = _d("model", "load_format")
    tiny: TinyShape | None = None

    @property
    def folder(self) -> str | None:
        """The folder the server reads the weights from (model_folder)."""
        return model_folder(msgspec.to_builtins(self))


class ServerSettings(_Struct):
    """vLLM settings (engine.server, or an experiment's override); None: vLLM's own."""

    max_num_seqs: int | None = None
    max_num_active_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    gpu_memory_utilization: float | None = None
    num_gpu_blocks_override: int | None = None
    kv_tokens: int | None = None  # the KV budget in tokens: filledfirst.engine.command.kv_blocks
    block_size: int | None = None
    tensor_parallel_size: int | None = None  # GPUs per server (filledfirst.engine.devices)
    kv_cache_space_gib: int | None = None
    enforce_eager: bool | None = None
    extra_args: list[str] | None = None

    def given(self) -> dict[str, Any]:
        """The settings this sets, as the mapping of vLLM settings a server starts with."""
        return {f: v for f in self.__struct_fields__ if (v := getattr(self, f)) is not None}


class ExternalServer(_Struct):
    url: str
    api_key_env: str | None = None
    # the limits it was started with, as its owner states them (its /metrics does not say them)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None

    @property
    def limits(self) -> dict[str, int]:
        """The stated limits as vLLM settings (run.json's server.settings)."""
        return {k: v for k, v in (("max_num_seqs", self.max_num_seqs),
                                  ("max_num_batched_tokens", self.max_num_batched_tokens)) if v is not None}


class EngineStart(_Struct):
    """How to start the server, without its vLLM settings: an experiment's spec keeps
    those apart, merged (`ExperimentSpec.server`)."""

    launcher: Literal["cpu", "gpu", "llamacpp", "sglang"]
    host: str = _d("engine", "host")
    port: int | None = None  # None: a free port per start
    startup_timeout_s: float = _d("engine", "startup_timeout_s")
    seed: int = _d("engine", "seed")
    server_nice: int = _d("engine", "server_nice")
    pause_between_blocks: bool = _d("engine", "pause_between_blocks")
    env: dict[str, str] = {}
    wrapper: list[str] = []  # the command the launcher's runs inside (a container)


class Engine(EngineStart):
    server: ServerSettings = ServerSettings()

    def start(self) -> EngineStart:
        return EngineStart(**{f: getattr(self, f) for f in EngineStart.__struct_fields__})


class Loadgen(_Struct):
    request_timeout_s: float = _d("loadgen", "request_timeout_s")
    connect_timeout_s: float | None = None  # None: no limit of its own
    first_token_timeout_s: float | None = None
    drain_timeout_s: float = _d("loadgen", "drain_timeout_s")
    seed: int = _d("loadgen", "seed")
    mode: Literal["open", "closed"] = _d("loadgen", "mode")
    concurrency: int | None = None
    api: Literal["completions", "chat"] = _d("loadgen", "api")
    prompt: Literal["token_ids", "text"] = _d("loadgen", "prompt")
    workers: int | Literal["auto"] = _d("loadgen", "workers")


class LoadMode(_Struct):
    """An experiment's override of the study's loadgen: None keeps the study's."""

    mode: Literal["open", "closed"] | None = None
    concurrency: int | None = None


class TraceColumns(_Struct):
    """How a trace file's rows are read (filledfirst.trace.formats): which column holds
    what, and the unit of its arrival times. `file_type` None: from the file's suffix."""

    time: str
    prompt: str
    output: str
    time_unit: Literal["iso", "s", "ms", "us", "ns"] = "iso"
    file_type: Literal["csv", "jsonl"] | None = None
    prefix_blocks: str | None = None  # a list of block ids per request: equal leading ids, a shared prefix
    block_tokens: int | None = None  # tokens per prefix block in the trace
    session: str | None = None


class Trace(_Struct):
    url: str
    file: str
    sha256: str | None = None
    size: int | None = None
    format: str | TraceColumns = _d("traces", "*", "format")


class RelativeRate(_Struct):
    """A relative rate (a phase's or a trace window's `rate`): `times` x the knee (the
    result's `lo`) of the search `of` (`<frontier>/<setting>`); resolved by
    filledfirst.frontier.relative into an interval_s or a time_scale."""

    of: str
    times: float

    @property
    def frontier(self) -> str:
        return self.of.partition("/")[0]

    @property
    def setting(self) -> str:
        return self.of.partition("/")[2]


class TraceWorkload(_Struct, tag_field="kind", tag="trace"):
    trace: str
    minutes: float
    description: str = ""
    # The schema's oneOf branches cannot carry defaults: these are the only ones.
    start_offset_s: float = 0.0
    start: str | None = None  # a timestamp instead of start_offset_s
    skip_bad: bool = False
    keep_every: int = 1
    phase: int = 0
    time_scale: float = 1.0
    rate: RelativeRate | None = None  # instead of time_scale; resolved before the schedule is made
    length_scale: float = 1.0  # prompt, output and prefix block sizes x this (filledfirst.trace.prefix)


class SharedPrefix(_Struct):
    """A phase's prompts start with one of `prefixes` shared prefixes of `tokens` tokens,
    taken in turn (request k of the phase gets prefix k mod prefixes)."""

    prefixes: int
    tokens: int


class SyntheticPhase(_Struct):
    role: str
    count: int
    prompt_tokens: int
    output_tokens: int
    start_s: float = 0.0
    interval_s: float = 0.0
    rate: RelativeRate | None = None  # instead of interval_s; resolved before the schedule is made
    arrival: Literal["constant", "poisson", "gamma"] = "constant"
    cv: float = 1.0
    shared_prefix: SharedPrefix | None = None


class SyntheticWorkload(_Struct, tag_field="kind", tag="synthetic"):
    phases: list[SyntheticPhase]
    description: str = ""
    seed: int = 0


Workload = TraceWorkload | SyntheticWorkload


class Experiment(_Struct):
    workload: str
    description: str = ""
    # Either vLLM settings on top of engine.server or an external endpoint (`url`): see
    # `external` and `settings`.
    server: dict[str, Any] = {}
    loadgen: LoadMode = LoadMode()
    section: str | None = None
    expect: str | None = None
    share_server: bool = _d("experiments", "*", "share_server")

    @property
    def external(self) -> ExternalServer | None:
        return msgspec.convert(self.server, ExternalServer) if "url" in self.server else None

    @property
    def settings(self) -> ServerSettings:
        """The experiment's own overrides (not merged with engine.server); empty for an
        external endpoint."""
        return ServerSettings() if "url" in self.server else msgspec.convert(self.server, ServerSettings)


class Sweep(_Struct):
    """A closed-loop concurrency sweep (the config's `sweeps`): one experiment per
    concurrency N, `<sweep>_c<N>`, with its workload of the same name."""

    concurrency: list[int]
    prompt_tokens: int
    output_tokens: int
    requests_per_worker: int = _d("sweeps", "*", "requests_per_worker")
    section: str | None = None
    server: dict[str, Any] | None = None  # settings over engine.server, as an experiment's

    def expanded(self, name: str) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
        """`<name>_c<N>` -> (its workload, its experiment), as a config would write them."""
        out = {}
        for n in self.concurrency:
            phase = {"role": name, "count": self.requests_per_worker * n,
                     "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens}
            experiment = {"description": f"closed loop, {n} worker{'s' if n != 1 else ''}",
                          "workload": f"{name}_c{n}", "loadgen": {"mode": "closed", "concurrency": n},
                          **({"section": self.section} if self.section is not None else {}),
                          **({"server": self.server} if self.server is not None else {})}
            out[f"{name}_c{n}"] = ({"kind": "synthetic", "phases": [phase]}, experiment)
        return out


def sweep_of(experiment: str) -> str:
    """The sweep an experiment `<sweep>_c<N>` belongs to (the name itself for another)."""
    head, sep, n = experiment.rpartition("_c")
    return head if sep and n.isdigit() else experiment


def expand_sweeps(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The config with each sweep's workloads and experiments after the written ones (in
    the order of its concurrency list), so that everything reading `experiments` (server
    groups, fingerprints, the report) sees a sweep's runs as if they had been written out;
    `sweeps` stays. Expanding an expanded config changes nothing; a written workload or
    experiment of another content under a sweep's name is an error."""
    out = dict(cfg)
    if not cfg.get("sweeps"):
        return out
    workloads, experiments = dict(cfg.get("workloads") or {}), dict(cfg.get("experiments") or {})
    for name, written in cfg["sweeps"].items():
        for run, (workload, experiment) in msgspec.convert(written, Sweep).expanded(name).items():
            have_wl, have_exp = workloads.get(run), experiments.get(run)
            if have_wl is None and have_exp is None:
                workloads[run], experiments[run] = workload, experiment
            elif have_wl != workload or not isinstance(have_exp, Mapping) or any(
                    have_exp.get(k) != v for k, v in experiment.items()):
                raise UserError(f"sweeps.{name}: {run!r} is already a workload or an experiment: rename one")
    return {**out, "workloads": workloads, "experiments": experiments}


class Report(_Struct):
    title: str | None = None
    publish: bool = _d("report", "publish")


class CompareGate(_Struct):
    knee_drop: float | None = _d("compare", "fail_on", "knee_drop")
    label_change: bool = _d("compare", "fail_on", "label_change")


class Compare(_Struct):
    """The config's `compare` section (filledfirst.compare): the baseline, when a
    difference counts, and what fails a scheduled job."""

    baseline: str | None = _d("compare", "baseline")
    knee_min_shift: float = _d("compare", "knee_min_shift")
    run_min_change: float = _d("compare", "run_min_change")
    confidence: float = _d("compare", "confidence")
    resamples: int = _d("compare", "resamples")
    fail_on: CompareGate = CompareGate()


class Cluster(_Struct):
    gpus_per_job: int | None = None  # None: filledfirst.cluster.gpus_per_job's default
    gpu_model: str | None = None
    gpu_request: Literal["gpus", "gres"] = _d("cluster", "gpu_request")
    partition: str | None = None
    account: str | None = None
    max_runtime_min: int | None = None  # None: no limit known
    cpus_per_job: int = _d("cluster", "cpus_per_job")
    mem_mb: int = _d("cluster", "mem_mb")
    startup_allowance_s: float | None = None  # None: engine.startup_timeout_s
    drain_allowance_s: float | None = None  # None: the experiment's loadgen.drain_timeout_s


# The thresholds' bounds, checked when a config overrides one.
_Share = Annotated[float, msgspec.Meta(ge=0, le=1)]
_PositiveShare = Annotated[float, msgspec.Meta(gt=0, le=1)]
_Positive = Annotated[float, msgspec.Meta(gt=0)]
_NonNegative = Annotated[float, msgspec.Meta(ge=0)]
_NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
_Count = Annotated[int, msgspec.Meta(ge=1)]
_Percent = Annotated[float, msgspec.Meta(ge=0, le=100)]
_BelowOne = Annotated[float, msgspec.Meta(ge=0, lt=1)]
_AboveOne = Annotated[float, msgspec.Meta(gt=1)]


def _rule(default: Any, meaning: str) -> Any:
    return dataclasses.field(default=default, metadata={"meaning": meaning})


@dataclasses.dataclass(frozen=True)
class DiagnosisRules:
    """Every threshold of the labels and warnings of `filledfirst diagnose`: its default and
    its meaning, defined here once (a config's `diagnosis` overrides some by name;
    config/README.md lists them, rendered from here).

    Shares are of the loaded window's time: first arrival + warmup_frac of the arrival
    span, to the last arrival."""

    warmup_frac: _BelowOne = _rule(0.1, "of the arrival span, cut from the window's start")
    cap_frac: _PositiveShare = _rule(0.9, (
        "running >= this x max_num_seqs counts as at the cap in the at-the-cap share the report quotes (what held a "
        "waiting request tests the cap exactly)"))
    default_cap: _Count | None = _rule(None, "max_num_seqs for runs that record none (external replays)")
    kv_full_pct: _Percent = _rule(90, (
        "KV usage (%) that counts as full: in the KV-full share the report quotes, and for what held a waiting request "
        "where no server timing says which request was at the head of the queue"))
    long_prompt_factor: _AboveOne = _rule(10, "a long prompt: this many times the run's median prompt")
    interference_min_ratio: _Positive = _rule(3, "TTFT p90 during long prefills / otherwise")
    interference_min_requests: _Count = _rule(5, (
        "short requests arriving during long prefills (outside a queue of the cap or full KV) needed for the "
        "interference label"))
    interference_min_share: _Share = _rule(0.05, "and their share of the sent short requests")
    interference_min_prefill_ratio: _Positive = _rule(2, (
        "where the server reports per-request timings: also the p90 of their TTFT outside vLLM's queue (from send: "
        "its prefill and the front end, where the wait for the engine step under way shows) / otherwise; long "
        "prefills then run from vLLM's scheduling of the long prompt"))
    waiting_min_share: _Share = _rule(0.2, (
        "requests queued: a waiting queue at least this share of the window (or vLLM's queue a share of TTFT, "
        "queue_min_ttft_share)"))
    eviction_min_ideal_share: _Share = _rule(0.2, (
        "for prefix-cache eviction, an unbounded cache would have served at least this share of the prompt tokens "
        "(the trace offered reuse)"))
    eviction_max_efficiency: _Share = _rule(0.5, (
        "for prefix-cache eviction, the cache served less than this share of what an unbounded cache would have"))
    budget_min_fill: _Share = _rule(0.8, (
        "the steps from a scrape to the next carried on average at least this share of the per-step token budget "
        "(max_num_batched_tokens): the budget held the requests waiting at that scrape"))
    queue_min_ttft_share: _Share = _rule(0.25, (
        "requests queued: where the server reports per-request timings, vLLM's queue at least this share of the TTFT "
        "of the requests arriving in the window (a bursty run queues in short bursts: little of the time, much of its "
        "requests' wait)"))
    next_min_share: _Share = _rule(0.1, (
        "a second constraint holding at least this share of the waiting is named as what filled next (less is the "
        "scrapes catching a step boundary, not a limit)"))
    max_lag_ms: _NonNegative = _rule(50, "dispatch lag p99 above this: client-limited")
    max_client_cpu_share: _PositiveShare = _rule(0.9, (
        "the client's CPU time over the replay's wall time (one event loop: one core) at or above this: "
        "client-limited"))
    min_arrival_ratio: _PositiveShare = _rule(0.95, (
        "open loop: requests sent per second over those scheduled per second below this: client-limited"))
    max_failed_share: _Share = _rule(0.01, "failed requests above this share: a warning")
    littles_min_ratio: _Positive = _rule(0.8, (
        "server in-flight over client in-flight (Little's law) below this: a warning"))
    littles_max_ratio: _Positive = _rule(1.25, "and above this: a warning")
    littles_min_arrivals: _Count = _rule(20, "arrivals in the window needed to check Little's law")
    scrape_hold_factor: _Positive = _rule(2.0, (
        "a scraped value stands for at most this x the scrape interval (or until the next scrape, good or failed)"))
    min_scrape_coverage: _Share = _rule(0.8, "share of the loaded window the scrapes must cover for any label")
    min_window_scrapes: _Count = _rule(4, "scrapes inside the loaded window needed for any label")
    slo_ttft_ms: _Positive = _rule(1000, "TTFT objective of the goodput")
    slo_itl_ms: _Positive = _rule(200, "against each request's longest gap between tokens (a stall)")
    slo_min_met_share: _Share = _rule(0.95, (
        "a run whose requests did not queue is a reference if at least this share of the answered requests "
        "arriving in the loaded window met the SLO (the capacity search's default target); fewer: nothing queued, "
        "the steps themselves were too slow: compute-bound"))

    @classmethod
    def from_config(cls, section: Mapping[str, Any] | None) -> DiagnosisRules:
        """From a config's `diagnosis` section (absent keys keep their defaults)."""
        section = dict(section or {})
        unknown = sorted(set(section) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise UserError(f"diagnosis: unknown setting(s) {unknown} (known: config/README.md, diagnosis)")
        try:
            return msgspec.convert(section, cls)
        except msgspec.ValidationError as exc:
            raise UserError(f"diagnosis: {exc}") from None


class Interventions(_Struct):
    """A frontier's `interventions` (filledfirst.frontier.interventions)."""

    settings: bool | list[str]  # true: every setting
    factor: int = _d("frontiers", "*", "interventions", "factor")
    min_shift: float = _d("frontiers", "*", "interventions", "min_shift")
    paired: bool = _d("frontiers", "*", "interventions", "paired")
    search: bool = _d("frontiers", "*", "interventions", "search")


class Frontier(_Struct):
    """A capacity search (filledfirst.frontier): one per server setting."""

    workload: str
    settings: dict[str, ServerSettings]
    slo: Slo
    start: float
    maximum: float
    description: str = ""
    target_attainment: float = _d("frontiers", "*", "target_attainment")
    probe_s: float = _d("frontiers", "*", "probe_s")
    probe_lifetimes: float = _d("frontiers", "*", "probe_lifetimes")
    probe_max_s: float = _d("frontiers", "*", "probe_max_s")
    probe_stretches: int = _d("frontiers", "*", "probe_stretches")
    growth: float = _d("frontiers", "*", "growth")
    precision: float = _d("frontiers", "*", "precision")
    budget: int = _d("frontiers", "*", "budget")
    repeats: int = _d("frontiers", "*", "repeats")
    confidence: float = _d("frontiers", "*", "confidence")
    backlog_max_growth: float | None = _d("frontiers", "*", "backlog_max_growth")
    extensions: int = _d("frontiers", "*", "extensions")
    estimate: bool = _d("frontiers", "*", "estimate")
    estimate_batches: int = _d("frontiers", "*", "estimate_batches")
    estimate_step: float = _d("frontiers", "*", "estimate_step")
    drift_max: float = _d("frontiers", "*", "drift_max")
    interventions: Interventions | None = None  # None: no setting's knee is tested


class ReferenceRole(_Struct):
    role: str
    n: str = ""
    ttft_p50: str = ""
    ttft_p90: str = ""
    itl_p50: str = ""


class ReferenceSweep(_Struct):
    concurrency: str
    ttft_p50: str = ""
    ttft_p95: str = ""
    tok_s_per_request: str = ""
    total_tok_s: str = ""


class Section(_Struct):
    """One of the study's sections: a table of the report (filledfirst.report.parts)."""

    title: str
    table: Literal["signals", "roles", "sweep"] = "signals"  # the schema names this default
    rows: list[str] = []  # empty: filledfirst.report.parts.DEFAULT_ROWS
    reference: dict[str, dict[str, str]] = {}
    reference_roles: list[ReferenceRole] = []
    reference_sweep: list[ReferenceSweep] = []
    reference_from: str | None = None  # whose figures the reference columns are
    knees: str | None = None  # a frontier whose knees the section shows side by side


class Study(_Struct):
    study: StudyInfo
    model: Model
    engine: Engine
    workloads: dict[str, Workload] = {}
    experiments: dict[str, Experiment] = {}
    traces: dict[str, Trace] = {}
    loadgen: Loadgen = Loadgen()
    scrape: Scrape = Scrape()
    report: Report = Report()
    cluster: Cluster = Cluster()
    diagnosis: DiagnosisRules = DiagnosisRules()
    compare: Compare = Compare()
    frontiers: dict[str, Frontier] = {}
    sweeps: dict[str, Sweep] = {}  # expanded into workloads and experiments (expand_sweeps)
    share_server: bool = _d("share_server")
    # A file name until filledfirst.config.load_config reads it (Snakemake's own config).
    sections: dict[str, Section] | str = {}
    # The config as written, sweeps expanded (with the schema's defaults): what a fingerprint
    # hashes, so that a key the user did not write never changes one
    # (filledfirst.config.spec_document).
    document: dict[str, Any] = {}

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any]) -> Study:
        """A config dict the schema has validated (defaults filled in or not), its sweeps
        expanded."""
        if "document" in cfg:
            raise UserError("document: not a config key")
        cfg = expand_sweeps(cfg)
        DiagnosisRules.from_config(cfg.get("diagnosis"))  # names the schema does not list are errors
        return msgspec.structs.replace(msgspec.convert(cfg, cls), document=dict(cfg))

    def loadgen_for(self, experiment: str) -> Loadgen:
        """The study's loadgen with the experiment's overrides on top."""
        own = self.experiments[experiment].loadgen
        changes = {f: v for f in own.__struct_fields__ if (v := getattr(own, f)) is not None}
        return msgspec.structs.replace(self.loadgen, **changes)


class ServerSpec(_Struct):
    """What makes two servers the same process: the model, how the engine starts, and the
    vLLM settings (engine.server with the experiment's or the search setting's on top; a
    free-form mapping of vLLM flags, or an external endpoint's url and api_key_env)."""

    model: Model
    engine: EngineStart
    server: dict[str, Any]


class ExperimentSpec(_Struct):
    """Everything that decides an experiment's (or a capacity-search probe's) outcome:
    what filledfirst.config.experiment_spec builds and run.json keeps under `spec`."""

    experiment: str
    workload_name: str
    workload: Workload
    server: dict[str, Any]  # as ServerSpec.server
    model: Model
    engine: EngineStart
    description: str = ""
    loadgen: Loadgen = Loadgen()  # the study's with the experiment's overrides on top
    scrape: Scrape = Scrape()

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> ExperimentSpec:
        """A spec document (filledfirst.config.spec_document), typed."""
        return msgspec.convert(doc, cls)

    def to_doc(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)

    @property
    def server_spec(self) -> ServerSpec:
        return ServerSpec(model=self.model, engine=self.engine, server=self.server)


def default_of(cls: type, name: str) -> Any:
    """A field's default (for a command-line flag that stands for the same key)."""
    field = next(f for f in msgspec.structs.fields(cls) if f.name == name)
    return field.default


def as_study(cfg: Study | Mapping[str, Any]) -> Study:
    """A Study as it is, or a validated config dict converted."""
    return cfg if isinstance(cfg, Study) else Study.from_dict(cfg)


# The loadgen's defaults, for what takes them outside a study (`filledfirst replay`).
LOADGEN = Loadgen()
SCRAPE = Scrape()
