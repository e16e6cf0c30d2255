"""The engine-neutral names filledfirst reads signals by, defined once: each the union of
every engine's names for it (filledfirst.engines: one module per engine, where its names
live). A server speaks one engine's names, so a run's signal is that engine's; a signal
an engine does not expose is unknown (NULL) in its runs, and what that engine cannot tell
is its `cannot`.

The scraper keeps every sample of a known engine (PREFIXES); the server's idle check, the
signals and the diagnosis pick theirs by the names below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from prometheus_client.parser import text_string_to_metric_families

from filledfirst.contracts.gauges import Gauges
from filledfirst.contracts.records import SampleRecord
from filledfirst.engines import ENGINES
from filledfirst.engines.names import Series


def _all(field: str) -> tuple:
    return tuple(x for e in ENGINES for x in getattr(e, field))


PREFIXES = tuple(e.prefix for e in ENGINES)
RUNNING: tuple[str, ...] = _all("running")
WAITING: tuple[str, ...] = _all("waiting")
KV_USAGE: tuple[str, ...] = _all("kv_used")  # the used share (0-1) of the KV pool
PREEMPTIONS: tuple[str, ...] = _all("preemptions")
STEPS: tuple[str, ...] = _all("steps")
STEP_TOKENS: tuple[str, ...] = _all("step_tokens")
KV_TOKENS: tuple[str, ...] = _all("kv_tokens")  # the KV pool in tokens, where an engine says it as a gauge
PROMPT_COMPUTED: tuple[Series, ...] = _all("prompt_computed")
GENERATED: tuple[Series, ...] = _all("generated")
TTFT_HISTOGRAMS = tuple(e.ttft_histogram for e in ENGINES if e.ttft_histogram)
QUEUE_TIME_HISTOGRAMS = tuple(e.queue_histogram for e in ENGINES if e.queue_histogram)


@dataclass(frozen=True)
class Gauge:
    """One scheduler gauge: its names, how engines combine (a data-parallel server
    exposes one series per engine) and the factor to its unit."""

    signal: str  # its name in the signals (and a field of contracts.gauges.Gauges)
    names: tuple[str, ...]
    across_engines: Literal["sum", "max"]
    scale: float = 1.0


# The one list of gauges: the signals' SQL (analysis.signals.GAUGES) and latest_gauges
# both read it.
GAUGES = (
    Gauge("running", RUNNING, "sum"),
    Gauge("waiting", WAITING, "sum"),
    Gauge("kv_pct", KV_USAGE, "max", 100.0),  # the fullest engine, in percent
)

# The scraper's own health, stored beside the server's samples.
SCRAPE_SECONDS = "filledfirst:scrape_duration_seconds"
SCRAPE_ERROR = "filledfirst:scrape_error"

def sql_list(names: tuple[str, ...]) -> str:
    """`'a', 'b'` for `metric IN (...)`. Constant names from this module, never user
    input: safe to inline."""
    return ", ".join("'" + n.replace("'", "''") + "'" for n in names)


_GAUGE_OF = {name: g for g in GAUGES for name in g.names}


def parse_metrics(text: str, t: float) -> list[SampleRecord]:
    """Every sample of a known engine (PREFIXES) on one Prometheus text page, stamped `t`."""
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.startswith(PREFIXES):
                continue
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out.append(SampleRecord(t, s.name, labels, float(s.value)))
    return out


def latest_gauges(samples: list[SampleRecord]) -> Gauges:
    """The gauges of one scrape, as GAUGES combines them; a gauge with a value that is
    not finite, or with none, is unknown (None), as in the signals."""
    values: dict[str, list[float]] = {g.signal: [] for g in GAUGES}
    for s in samples:
        if s.metric in _GAUGE_OF:
            values[_GAUGE_OF[s.metric].signal].append(s.value)
    out = {}
    for g in GAUGES:
        v = values[g.signal]
        if not v or not all(math.isfinite(x) for x in v):
            out[g.signal] = None
        else:
            out[g.signal] = (sum(v) if g.across_engines == "sum" else max(v)) * g.scale
    return Gauges(**out)


# The scheduler's state per scrape and engine (filledfirst.contracts.scheduler): the
# gauges, the counters it is judged by (their running totals; the diagnosis takes their
# increases), and the cache's size: from an info gauge's labels (vLLM's cache settings) or
# a gauge of its tokens (blocks of one token).
CACHE_INFO: tuple[str, ...] = _all("cache_info")
# A sample's engine (its `engine` label, vLLM's, or `dp_rank`, SGLang's; none: engine 0, a
# server that is not data-parallel).
ENGINE_SQL = ("coalesce(nullif(regexp_extract(labels, '(^|,)engine=([^,]*)', 2), ''), "
              "nullif(regexp_extract(labels, '(^|,)dp_rank=([^,]*)', 2), ''), '0')")


def _label_int(key: str) -> str:
    return f"TRY_CAST(regexp_extract(labels, '(^|,){key}=([0-9]+)', 2) AS BIGINT)"


def series_sql(series: tuple[Series, ...]) -> str:
    """A condition on a sample (columns metric, labels) that holds for any of `series`."""
    parts = [f"(metric = '{s.metric}'" + (f" AND list_contains(string_split(labels, ','), '{s.label}')" if s.label
                                           else "") + ")" for s in series]
    return "(" + (" OR ".join(parts) or "FALSE") + ")"


def _in(names: tuple[str, ...]) -> str:
    return f"metric IN ({sql_list(names)})" if names else "FALSE"


def scheduler_state_sql(samples: str) -> str:
    """Per run, scrape time and engine, from `samples` (rows of table samples): running,
    waiting, kv_used (0-1), and the counters preemptions, steps, step_tokens (the tokens
    those steps carried), prompt_tokens (computed, not served from a cache), generated;
    blocks and block_size of the KV pool. NULL where the engine does not say."""
    counted = PROMPT_COMPUTED + GENERATED
    names = (RUNNING + WAITING + KV_USAGE + PREEMPTIONS + STEPS + STEP_TOKENS + KV_TOKENS + CACHE_INFO
             + tuple(s.metric for s in counted))
    return f"""
    SELECT run_id, t, {ENGINE_SQL} AS engine,
           max(value) FILTER ({_in(RUNNING)}) AS running,
           max(value) FILTER ({_in(WAITING)}) AS waiting,
           max(value) FILTER ({_in(KV_USAGE)}) AS kv_used,
           max(value) FILTER ({_in(PREEMPTIONS)}) AS preemptions,
           max(value) FILTER ({_in(STEPS)}) AS steps,
           max(value) FILTER ({_in(STEP_TOKENS)}) AS step_tokens,
           max(value) FILTER ({series_sql(PROMPT_COMPUTED)}) AS prompt_tokens,
           max(value) FILTER ({series_sql(GENERATED)}) AS generated,
           coalesce(max({_label_int('num_gpu_blocks')}) FILTER ({_in(CACHE_INFO)}),
                    CAST(max(value) FILTER ({_in(KV_TOKENS)}) AS BIGINT)) AS blocks,
           coalesce(max({_label_int('block_size')}) FILTER ({_in(CACHE_INFO)}),
                    CASE WHEN count(*) FILTER ({_in(KV_TOKENS)}) > 0 THEN 1 END) AS block_size
    FROM ({samples})
    WHERE metric IN ({sql_list(tuple(dict.fromkeys(names)))})
    GROUP BY ALL"""
