"""Every vLLM metric name filledfirst reads, defined once.

The scraper keeps every `vllm:` sample (PREFIX); the server's idle check, the signals and
the diagnosis pick theirs by the names below. Where vLLM has spelt one thing two ways,
the tuple holds both and every reader accepts either. The per-request timings a stream's
last usage chunk carries are at the end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from prometheus_client.parser import text_string_to_metric_families

from filledfirst.contracts.gauges import Gauges
from filledfirst.contracts.records import SampleRecord

PREFIX = "vllm:"

RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
# vLLM renamed the KV gauge; older builds expose the gpu_ name (also on the CPU). Both are
# the used fraction (0-1) of the KV cache.
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
# The counter's sample name carries `_total`; a scraper that stores the family name keeps
# it without. `_created` (a timestamp) must never match, hence an explicit list.
PREEMPTIONS = ("vllm:num_preemptions_total", "vllm:num_preemptions")
# The prefix cache's counters, in tokens: looked up (a request's prompt tokens, each time
# it is scheduled) and served from the cache. Their ratio is the server's hit rate.
PREFIX_CACHE_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries")
PREFIX_CACHE_HITS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits")


@dataclass(frozen=True)
class Gauge:
    """One scheduler gauge: its vLLM names, how engines combine (a data-parallel server
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

# An info gauge: each engine's cache settings (block_size, num_gpu_blocks, ...) as labels.
CACHE_CONFIG_INFO = "vllm:cache_config_info"
# Histograms (family names; their buckets are `<name>_bucket`).
TTFT_HISTOGRAM = "vllm:time_to_first_token_seconds"
QUEUE_TIME_HISTOGRAM = "vllm:request_queue_time_seconds"
# Tokens of each engine step, a histogram observed once per step: its `_count` counts the
# steps. Its `_sum` counts a step's generated tokens and, as the prompt finishes, the
# prompt tokens it computed, all at once: a prefill chunked over several steps shows as
# empty steps then one step of the whole prompt. So no bucket shows a step that used the
# whole per-step token budget (max_num_batched_tokens); the mean over a stretch of steps,
# _sum / _count, does (filledfirst.analysis.diagnosis.sql).
ITERATION_TOKENS = "vllm:iteration_tokens_total"

# The scraper's own health, stored beside the server's samples.
SCRAPE_SECONDS = "filledfirst:scrape_duration_seconds"
SCRAPE_ERROR = "filledfirst:scrape_error"

# Per-request server timings: vLLM started with `--enable-per-request-metrics` (0.32;
# refused together with `--disable-log-stats`) puts a `metrics` object on the final usage
# chunk of a stream (completions and chat; `stream_options.include_usage`), built by
# vllm/entrypoints/generate/base/serving.py `build_per_request_timing_metrics` from the
# engine core's timestamps of the request: QUEUED (when the engine core's loop took it in,
# between two steps), SCHEDULED (first time only: a preempted request's wait again is in
# prefill or decode), its first and its last token. A field the server could not compute
# is left out (null). Our field -> vLLM's key:
PER_REQUEST_METRICS = "metrics"
PER_REQUEST = {
    "server_queue_ms": "queue_time_ms",  # queued to scheduled
    "server_prefill_ms": "time_to_first_token_ms",  # scheduled to the first token: prefill
    "server_decode_ms": "generation_time_ms",  # first token to last token
    "server_itl_ms": "mean_itl_ms",  # generation_time over the tokens after the first
}


def sql_list(names: tuple[str, ...]) -> str:
    """`'a', 'b'` for `metric IN (...)`. Constant names from this module, never user
    input: safe to inline."""
    return ", ".join("'" + n.replace("'", "''") + "'" for n in names)


_GAUGE_OF = {name: g for g in GAUGES for name in g.names}


def parse_metrics(text: str, t: float) -> list[SampleRecord]:
    """Every `vllm:` sample of one Prometheus text page, stamped `t`."""
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.startswith(PREFIX):
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
# increases), and the cache's size from the engine's cache settings.
GENERATION_TOKENS = ("vllm:generation_tokens_total", "vllm:generation_tokens")
# Prompt tokens by where they came from; `local_compute` is what the engine computed.
PROMPT_TOKENS_BY_SOURCE = ("vllm:prompt_tokens_by_source_total", "vllm:prompt_tokens_by_source")
PROMPT_COMPUTED_SOURCE = "local_compute"
# A sample's engine (its `engine` label; none: engine 0, a server that is not data-parallel).
ENGINE_SQL = "coalesce(nullif(regexp_extract(labels, '(^|,)engine=([^,]*)', 2), ''), '0')"


def _label_int(key: str) -> str:
    return f"TRY_CAST(regexp_extract(labels, '(^|,){key}=([0-9]+)', 2) AS BIGINT)"


def scheduler_state_sql(samples: str) -> str:
    """Per run, scrape time and engine, from `samples` (rows of table samples): running,
    waiting, kv_used (0-1), and the counters preemptions, steps, step_tokens (the tokens
    of the steps vLLM's step histogram observed), prompt_tokens (computed, not served
    from a cache), generated; blocks and block_size from the cache settings."""
    return f"""
    SELECT run_id, t, {ENGINE_SQL} AS engine,
           max(value) FILTER (metric IN ({sql_list(RUNNING)})) AS running,
           max(value) FILTER (metric IN ({sql_list(WAITING)})) AS waiting,
           max(value) FILTER (metric IN ({sql_list(KV_USAGE)})) AS kv_used,
           max(value) FILTER (metric IN ({sql_list(PREEMPTIONS)})) AS preemptions,
           max(value) FILTER (metric = '{ITERATION_TOKENS}_count') AS steps,
           max(value) FILTER (metric = '{ITERATION_TOKENS}_sum') AS step_tokens,
           max(value) FILTER (metric IN ({sql_list(PROMPT_TOKENS_BY_SOURCE)})
                              AND labels LIKE '%source={PROMPT_COMPUTED_SOURCE}%') AS prompt_tokens,
           max(value) FILTER (metric IN ({sql_list(GENERATION_TOKENS)})) AS generated,
           max({_label_int('num_gpu_blocks')}) FILTER (metric = '{CACHE_CONFIG_INFO}') AS blocks,
           max({_label_int('block_size')}) FILTER (metric = '{CACHE_CONFIG_INFO}') AS block_size
    FROM ({samples})
    WHERE metric IN ({sql_list(RUNNING + WAITING + KV_USAGE + PREEMPTIONS + GENERATION_TOKENS
                               + PROMPT_TOKENS_BY_SOURCE + (ITERATION_TOKENS + '_count', ITERATION_TOKENS + '_sum',
                                                            CACHE_CONFIG_INFO))})
    GROUP BY ALL"""
