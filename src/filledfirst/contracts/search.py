"""search.json, typed: what a capacity search leaves beside its probe folders.

`filledfirst frontier run` writes it once, atomically, when the search ends
(`SearchRecord.write`); everything that reads it back (ingest, which takes it for its
probe folders and stores it in table `frontier_searches`; table `frontiers`; the knees of
workloads placed relative to a search) decodes it once (`SearchRecord.read`,
`SearchRecord.loads`, `SearchRecord.decode`) and reads the fields, so a document that does not fit is refused
where it is read, naming the file. The file is JSON as `atomic.write_json` writes it (keys
sorted); unknown keys are allowed, so a file from a newer writer still reads.

The search's own terms are defined here too, since the record carries them: the SLO a
probe is judged by (`Slo`, also the config's `frontiers.*.slo`), the search's bounds
(`SearchBounds`, what filledfirst.frontier.search runs on) and why it stopped
(`StopReason`), and a probe's verdict (`Probe`), which both search.json's list and each
probe's run.json block (filledfirst.contracts.runmeta.FrontierProbe) carry.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import msgspec

from filledfirst import atomic, redact
from filledfirst.errors import UserError
from filledfirst.schema import schema_default

SEARCH_JSON = "search.json"
PREDICTION_JSON = "prediction.json"  # an intervention's predicted start, beside its search.json


class Slo(msgspec.Struct, frozen=True):
    ttft_ms: float  # time to first token
    itl_ms: float  # the longest gap between two tokens of a request


class StopReason(StrEnum):
    CONVERGED = "converged"  # hi/lo <= precision (and lo confirmed `repeats` times)
    BUDGET = "budget"  # the probe budget ran out first
    HOLDS_AT_MAXIMUM = "holds_at_maximum"  # maximum held: the capacity is at least maximum
    BREAKS_AT_START = "breaks_at_start"  # start broke: the capacity is below start
    PROBE_FAILED = "probe_failed"  # a probe failed outright (server died, ...)
    # an intervention's search: whether its knee moved from its parent's can no longer change
    DECIDED = "decided"
    # an intervention judged by its paired check alone (interventions.search false): no probes, no knee
    NOT_SEARCHED = "not_searched"


@dataclass(frozen=True, slots=True)
class SearchBounds:
    start: float  # first rate probed, requests/s
    maximum: float  # never probe above this
    # the defaults are the schema's (frontiers.<name>.*), defined once there
    target: float = schema_default("frontiers", "*", "target_attainment")  # attainment that holds the SLO
    growth: float = schema_default("frontiers", "*", "growth")  # grow-phase factor
    precision: float = schema_default("frontiers", "*", "precision")  # stop when hi/lo <= this
    budget: int = schema_default("frontiers", "*", "budget")  # at most this many probes, repeats included
    repeats: int = schema_default("frontiers", "*", "repeats")  # extra probes of the final lo
    confidence: float = schema_default("frontiers", "*", "confidence")  # of each probe's attainment interval
    # a probe's backlog growing faster than this (s of wait per s) breaks it; None: not tested
    backlog_max_growth: float | None = schema_default("frontiers", "*", "backlog_max_growth")
    extensions: int = schema_default("frontiers", "*", "extensions")  # re-probes of an inconclusive rate
    estimate_step: float = schema_default("frontiers", "*", "estimate_step")  # bracket step from an estimate

    def __post_init__(self) -> None:
        for name in ("start", "maximum", "target", "growth", "precision", "confidence", "estimate_step"):
            object.__setattr__(self, name, float(getattr(self, name)))
        problems = []
        if not (math.isfinite(self.start) and self.start > 0):
            problems.append(f"start must be > 0, got {self.start}")
        if not (math.isfinite(self.maximum) and self.maximum > self.start):
            problems.append(f"maximum must be above start ({self.start}), got {self.maximum}")
        if not (0 < self.target <= 1):
            problems.append(f"target must be in (0, 1], got {self.target}")
        if not (math.isfinite(self.growth) and self.growth > 1):
            problems.append(f"growth must be > 1, got {self.growth}")
        if not (math.isfinite(self.precision) and self.precision > 1):
            problems.append(f"precision must be > 1, got {self.precision}")
        if self.budget < 1:
            problems.append(f"budget must be >= 1, got {self.budget}")
        if self.repeats < 0:
            problems.append(f"repeats must be >= 0, got {self.repeats}")
        if not (0 <= self.confidence < 1):
            problems.append(f"confidence must be in [0, 1), got {self.confidence}")
        if self.backlog_max_growth is not None and not (self.backlog_max_growth >= 0):
            problems.append(f"backlog_max_growth must be >= 0, got {self.backlog_max_growth}")
        if self.extensions < 0:
            problems.append(f"extensions must be >= 0, got {self.extensions}")
        if not (math.isfinite(self.estimate_step) and self.estimate_step > 1):
            problems.append(f"estimate_step must be > 1, got {self.estimate_step}")
        if problems:
            raise ValueError("invalid search bounds: " + "; ".join(problems))


class _Record(msgspec.Struct, kw_only=True, frozen=True):
    pass


class Probe(_Record):
    """A probe's rate, length and verdict (None where it has none: it failed, or an older
    run folder did not record it). `held` and `verdict` are the probe's own; the search
    judges a rate by all its probes pooled (filledfirst.frontier.search)."""

    probe: int
    rate: float
    probe_s: float | None = None  # its seconds of arrivals
    offered_rps: float | None = None  # requests in its schedule over probe_s
    requests: int | None = None
    met: int | None = None  # requests that met the SLO
    attainment: float | None = None
    attainment_lo: float | None = None  # its interval at the search's confidence
    attainment_hi: float | None = None
    backlog_growth: float | None = None  # s of wait per s, middle to last third (frontier.verdict)
    verdict: str | None = None  # held, broke or inconclusive (filledfirst.frontier.verdict.Verdict)
    held: bool | None = None
    lifetime_p90_s: float | None = None  # its ok requests' scheduled arrival to end, p90
    error: str | None = None


class ProbeRecord(Probe, kw_only=True):
    """One probe: its run folder's frontier block and status, as the search used them."""

    run_dir: str  # relative to the search's folder
    run_id: str
    status: str
    reused: bool  # read back from a finished probe folder when the search resumed

    @classmethod
    def of(cls, probe: Probe, *, run_dir: str, run_id: str, status: str, reused: bool) -> ProbeRecord:
        return cls(**{f: getattr(probe, f) for f in Probe.__struct_fields__},
                   run_dir=run_dir, run_id=run_id, status=status, reused=reused)


class ResultRecord(_Record):
    """The bracket [lo, hi) and why the search stopped (filledfirst.frontier.search.SearchResult):
    the knee is lo, its interval [floor, hi) at `confidence`."""

    lo: float | None
    hi: float | None
    ratio: float | None
    reason: StopReason
    error: str | None
    floor: float | None = None
    confidence: float | None = None
    hi_inconclusive: bool = False


class Reference(_Record):
    """A closed loop at the setting's sequence cap (filledfirst.run.search): the rate the
    server sustains (Little's law: completions per second at a full batch), measured
    before the search (its capacity estimate) and after it (the drift check)."""

    run_dir: str
    run_id: str
    status: str
    concurrency: int
    requests: int | None = None  # ok requests
    throughput_rps: float | None = None  # completions per second after the first batch
    error: str | None = None


class Drift(_Record):
    """The server's speed on the reference closed loop at the end against the start."""

    start_rps: float
    end_rps: float
    change: float  # end / start - 1
    max_change: float  # the search's drift_max: beyond it the search says it drifted
    drifted: bool


class Knob(StrEnum):
    """A limit an intervention relaxes, in the ledger's units."""

    SEQS = "max_num_seqs"  # sequences in a step
    KV = "KV tokens"  # the KV budget, in tokens (kv_tokens, or blocks x block size)


class Intervention(_Record):
    """A search that relaxes one limit of another search's setting (filledfirst.frontier.interventions):
    `knob` from `before` to `after`, on the same workload shape, starting at that search's knee."""

    parent: str  # the setting relaxed
    knob: Knob
    before: int
    after: int
    changes: dict[str, Any]  # the vLLM settings it starts with on top of the parent's
    # the least shift of the knee that counts as a move before the parent's drift widens it
    # (the frontier's interventions.min_shift)
    min_shift: float = schema_default("frontiers", "*", "interventions", "min_shift")
    # measured side by side with the parent after its search (filledfirst.frontier.paired)
    paired: bool = schema_default("frontiers", "*", "interventions", "paired")
    # its own knee searched; False: the paired check alone judges it
    search: bool = schema_default("frontiers", "*", "interventions", "search")


class PredictedStart(_Record):
    """An intervention's first rate, predicted before its search (`filledfirst frontier
    predict`, in its folder as prediction.json): its parent's knee moved by the shift the
    engine's fitted step time predicts for the relaxation. `shift` None: no model could
    say (`why`), and the search starts at the parent's knee as it would without one."""

    frontier: str
    setting: str
    parent: str
    parent_fingerprint: str  # the parent search it was predicted from (a stale file is not used)
    parent_knee_rps: float | None
    shift: float | None
    model_scope: str | None = None  # the step model it used: the parent setting's own or the engine's
    searches: list[str] = []  # the searches whose scrapes the model was fitted on (<frontier>/<setting>)
    why: str = ""  # what it predicted, or why it could not

    @property
    def start_rps(self) -> float | None:
        if self.parent_knee_rps is None or self.shift is None:
            return self.parent_knee_rps
        return self.parent_knee_rps * (1 + self.shift)

    def write(self, path: str | Path) -> None:
        atomic.write_json(msgspec.to_builtins(self), path)

    @classmethod
    def read(cls, path: str | Path) -> PredictedStart:
        """The prediction.json at `path` (a FileNotFoundError when there is none)."""
        try:
            return msgspec.json.decode(Path(path).read_bytes(), type=cls)
        except msgspec.DecodeError as exc:
            raise UserError(f"{path}: not an intervention's predicted start ({exc})") from None


class Side(StrEnum):
    """The setting a block of a paired check measured (filledfirst.frontier.paired)."""

    PARENT = "parent"
    RELAXED = "relaxed"


class PairedBlock(_Record):
    """A block of the paired check: a closed loop of one side, and from its scrapes the
    share with the relaxed resource beyond the parent's limit in some engine and the share
    with requests waiting (of the scrapes with anything running or waiting; None: none
    scraped)."""

    side: Side
    loop: Reference
    beyond_share: float | None = None
    queue_share: float | None = None


class PairedCheck(_Record):
    """The intervention and its parent side by side, in blocks of the same closed loop
    (filledfirst.frontier.paired: AFTER_RELAXED or AFTER_PARENT)."""

    concurrency: int
    blocks: list[PairedBlock]


class SearchRecord(_Record):
    frontier: str
    setting: str
    workload: str
    fingerprint: str  # the search's identity (filledfirst.config.search_fingerprint)
    slo: Slo
    probe_s: float
    probe_lifetimes: float
    probe_max_s: float
    bounds: SearchBounds
    probes: list[ProbeRecord]
    result: ResultRecord
    probe_stretches: int = 1  # a trace probe's stretches of the window (filledfirst.frontier.probes)
    estimate: Reference | None = None  # None: the search grew from `start`
    estimate_rps: float | None = None  # the first rate it took from the estimate
    check: Reference | None = None
    drift: Drift | None = None
    intervention: Intervention | None = None  # None: a setting of the config, not a relaxation
    start_rps: float | None = None  # an intervention's first rate: its parent's knee, or its predicted knee
    predicted_start: PredictedStart | None = None  # what an intervention's first rate was predicted from
    paired: PairedCheck | None = None  # an intervention's paired check, when asked for

    @property
    def key(self) -> str:
        """`<frontier>/<setting>`, as a workload placed relative to its knee names it."""
        return f"{self.frontier}/{self.setting}"

    def run_dirs(self, folder: Path) -> list[Path]:
        """The probe folders, in probe order, of the search whose search.json is in `folder`."""
        return [Path(folder) / p.run_dir for p in self.probes]

    def to_doc(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)

    def write(self, path: str | Path) -> None:
        # Its errors come from the probes' run.json, redacted already: this is the file's own guarantee.
        atomic.write_json(redact.redact_document(self.to_doc()), path)

    @classmethod
    def decode(cls, doc: Any, where: str | Path) -> SearchRecord:
        """A parsed search.json as SearchRecord; a UserError naming `where` when it does not fit."""
        try:
            return msgspec.convert(doc, cls)
        except msgspec.ValidationError as exc:
            raise _not_a_search(where, exc) from None

    @classmethod
    def loads(cls, text: str | bytes, where: str | Path) -> SearchRecord:
        """A search.json's text as SearchRecord; a UserError naming `where` when it does not fit."""
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise _not_a_search(where, exc) from None
        return cls.decode(doc, where)

    @classmethod
    def read(cls, path: str | Path) -> SearchRecord:
        """The search.json at `path` (a FileNotFoundError when there is none)."""
        return cls.loads(Path(path).read_text(), path)


def _not_a_search(where: str | Path, why: Exception) -> UserError:
    return UserError(f"{where} is not a capacity search's search.json: {why}")
