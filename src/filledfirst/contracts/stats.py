"""A schedule's `<schedule>.stats.json` and a trace's stats file, typed.

filledfirst.schedule writes a schedule's stats beside it (its size and shape, and what
made it: a trace window or a synthetic workload); the runner copies them into run.json
under `schedule.stats`, the capacity search reads a trace shape's density from them, the
report describes the workload with them. `filledfirst trace stats` writes a whole trace's
figures (filledfirst.trace.stats). Keys a writer leaves out (a synthetic schedule has no
trace window) are absent from the file and None in what readers get.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET

from filledfirst import atomic
from filledfirst.contracts.document import Document, Opt, settled


def stats_path(schedule: str | Path) -> Path:
    """Where a schedule's stats are: `<schedule>.stats.json` beside it."""
    schedule = Path(schedule)
    return schedule.with_name(schedule.name + ".stats.json")


class Spread(Document):
    # "nearest" percentiles: whole numbers that actually occur.
    p50: int
    p90: int
    max: int
    mean: Opt[float] = UNSET  # a trace's stats only


class Window(Document):
    """The trace window a schedule was cut from."""

    start: str
    start_offset_s: float  # from the trace's first request
    minutes: float
    requests: int  # in the window, before keep_every


class Placement(Document):
    """A rate placed relative to a knee, as resolved (filledfirst.frontier.relative): the
    search's knee, `times` it, and what that made of a synthetic phase's interval or a
    trace window's time scale."""

    key: str  # where in the workload: `phases[i].rate`, or `rate`
    of: str  # the search: `<frontier>/<setting>`
    knee_rps: float  # its result's lo
    reason: str  # why it stopped
    search: str  # its search.json
    times: float
    rate_rps: float  # times x the knee
    role: Opt[str] = UNSET  # the phase's
    interval_s: Opt[float] = UNSET
    kept_per_s: Opt[float] = UNSET  # the trace window's requests per second of trace time
    time_scale: Opt[float] = UNSET


class ScheduleStats(Document):
    requests: Opt[int] = UNSET
    duration_s: Opt[float] = UNSET  # the span the arrivals are spread over
    mean_rate_per_s: Opt[float] = UNSET
    prompt_tokens: Opt[Spread] = UNSET
    output_tokens: Opt[Spread] = UNSET
    roles: Opt[dict[str, int]] = UNSET
    source: Opt[str] = UNSET  # the trace file's name, or "synthetic"
    phases: Opt[int] = UNSET  # a synthetic workload's
    # A trace window's (filledfirst.trace.subsample).
    read: Opt[str] = UNSET
    trace_requests: Opt[int] = UNSET
    trace_first: Opt[str] = UNSET
    trace_span_s: Opt[float] = UNSET
    window: Opt[Window] = UNSET
    stretches: Opt[list[Window]] = UNSET  # a probe's parts of the window, laid end to end
    keep_every: Opt[int] = UNSET
    phase: Opt[int] = UNSET
    time_scale: Opt[float] = UNSET
    max_model_len: Opt[int] = UNSET
    skipped: Opt[int] = UNSET
    skipped_by_reason: Opt[dict[str, int]] = UNSET
    zero_output: Opt[int] = UNSET
    clipped: Opt[int] = UNSET
    relative: Opt[list[Placement]] = UNSET
    # A trace read in a format other than Azure's, and one with prefix structure
    # (filledfirst.trace.prefix): the sizes before the length scale, the block sizes, and
    # the share of prompt tokens an unbounded prefix cache would serve.
    format: Opt[str] = UNSET
    length_scale: Opt[float] = UNSET
    trace_prompt_tokens: Opt[Spread] = UNSET
    trace_output_tokens: Opt[Spread] = UNSET
    trace_block_tokens: Opt[int] = UNSET
    block_tokens: Opt[int] = UNSET
    ideal_hit_share: Opt[float] = UNSET

    def write(self, schedule: str | Path) -> None:
        atomic.write_json(self.to_doc(), stats_path(schedule))

    @classmethod
    def decode(cls, doc: Any, where: str | Path = "schedule stats") -> ScheduleStats:
        """A parsed stats document; a ValueError naming `where` when it does not fit."""
        try:
            return settled(msgspec.convert(doc, cls))
        except msgspec.ValidationError as exc:
            raise ValueError(f"{where}: not a schedule's stats: {exc}") from None

    @classmethod
    def load(cls, path: str | Path, *, as_written: bool = False) -> ScheduleStats:
        """A stats file (the path of the file itself); a ValueError naming it when it does
        not fit. `as_written`: the keys it lacks stay UNSET, to copy it into another file."""
        try:
            stats = msgspec.json.decode(Path(path).read_bytes(), type=cls)
        except msgspec.DecodeError as exc:
            raise ValueError(f"{path}: not a schedule's stats: {exc}") from None
        return stats if as_written else settled(stats)


class TraceStats(Document):
    """A whole trace file's figures (`filledfirst trace stats`)."""

    source: str
    requests: int
    bad_rows: int
    first: str
    min: str
    max: str
    span_s: float
    mean_rate_per_s: float | None
    out_of_order: int
    zero_output: int
    prompt_tokens: Spread | None
    output_tokens: Spread | None
    # Minute i counts the rows in [first + 60 i, first + 60 (i + 1)) s (--start-offset 60 i).
    requests_per_minute: list[int]

    def write(self, path: str | Path) -> None:
        atomic.write_json(self.to_doc(), path)
