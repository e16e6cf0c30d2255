"""search.json, typed: what a capacity search leaves beside its probe folders.

`filledfirst frontier run` writes it once, atomically, when the search ends
(`SearchRecord.write`); everything that reads it back (ingest, which takes it for its
probe folders and stores it in table `frontier_searches`; table `frontiers`; the knees of
workloads placed relative to a search) decodes it once (`SearchRecord.read`,
`SearchRecord.decode`) and reads the fields, so a document that does not fit is refused
where it is read, naming the file. The file is JSON as `atomic.write_json` writes it (keys
sorted); unknown keys are allowed, so a file from a newer writer still reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from filledfirst import atomic, redact
from filledfirst.errors import UserError
from filledfirst.frontier.search import SearchBounds, SearchResult, Slo, StopReason

SEARCH_JSON = "search.json"


class _Record(msgspec.Struct, kw_only=True, frozen=True):
    pass


class ProbeRecord(_Record):
    """One probe: its run folder's frontier block and status, as the search used them."""

    probe: int
    rate: float
    probe_s: float | None
    run_dir: str  # relative to the search's folder
    run_id: str
    status: str
    requests: int | None
    attainment: float | None
    held: bool | None
    lifetime_p90_s: float | None
    error: str | None
    reused: bool  # read back from a finished probe folder when the search resumed


class ResultRecord(_Record):
    """The bracket [lo, hi) and why the search stopped (filledfirst.frontier.search.SearchResult)."""

    lo: float | None
    hi: float | None
    ratio: float | None
    reason: StopReason
    error: str | None

    @classmethod
    def of(cls, result: SearchResult) -> ResultRecord:
        return cls(lo=result.lo, hi=result.hi, ratio=result.ratio, reason=result.reason, error=result.error)


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
    def read(cls, path: str | Path) -> SearchRecord:
        """The search.json at `path` (a FileNotFoundError when there is none)."""
        try:
            doc = json.loads(Path(path).read_text())
        except ValueError as exc:
            raise _not_a_search(path, exc) from None
        return cls.decode(doc, path)


def _not_a_search(where: str | Path, why: Exception) -> UserError:
    return UserError(f"{where} is not a capacity search's search.json: {why}")
