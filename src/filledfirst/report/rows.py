"""The run-level query results the report reads (analysis.signals, analysis.request_path,
analysis.prefix_cache), typed: built once in filledfirst.report.data from each query's
rows (`of`), a field per column, NULL as None."""

from __future__ import annotations

from typing import TypeVar

import msgspec
import polars as pl

R = TypeVar("R", bound="_Row")


class _Row(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    @classmethod
    def of(cls: type[R], df: pl.DataFrame) -> list[R]:
        """The query's rows as records (a column the record lacks is an error: the field list
        is the query's)."""
        return [msgspec.convert(r, cls) for r in df.to_dicts()]


class RunRow(_Row, frozen=True, kw_only=True):
    """A run as the report reads it (analysis.signals.run_summary: its requests, signals and checks)."""

    run_id: str
    experiment: str | None = None
    description: str | None = None
    status: str | None = None
    error: str | None = None
    n_requests: int | None = None
    n_ok: int | None = None
    n_failed: int | None = None
    n_not_sent: int | None = None
    ttft_p50_ms: float | None = None
    ttft_p90_ms: float | None = None
    ttft_p99_ms: float | None = None
    ttft_timeouts: int | None = None
    ttft_content_p50_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    itl_chunk_p50_ms: float | None = None
    itl_chunk_p99_ms: float | None = None
    running_median: float | None = None
    running_max: float | None = None
    waiting_median: float | None = None
    waiting_max: float | None = None
    kv_median_pct: float | None = None
    kv_max_pct: float | None = None
    preemptions: float | None = None
    lag_p50_ms: float | None = None
    lag_p99_ms: float | None = None
    reasoning_tokens: int | None = None
    n_usage_mismatch: int | None = None
    max_num_seqs: int | None = None
    duration_s: float | None = None
    scrape_errors: int | None = None
    nonfinite_samples: int | None = None


class RoleRow(_Row, frozen=True, kw_only=True):
    """One request role of a run (analysis.signals.role_summary)."""

    run_id: str
    role: str | None = None
    n: int | None = None
    n_failed: int | None = None
    ttft_p50_ms: float | None = None
    ttft_p90_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None


class RunRates(_Row, frozen=True, kw_only=True):
    """A run's rates (analysis.signals.run_rates)."""

    run_id: str
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    tok_s_per_request: float | None = None
    total_tok_s: float | None = None
    offered_rps: float | None = None
    arrival_span_s: float | None = None
    n_failed: int | None = None


class PrefixCacheRow(_Row, frozen=True, kw_only=True):
    """A run's prefix cache against the ideal one (analysis.prefix_cache.counts)."""

    run_id: str
    n_with_ideal: int | None = None
    n_unreported: int | None = None
    prompt_tokens: float | None = None
    cached_tokens: float | None = None
    ideal_tokens: float | None = None
    server_hit_tokens: float | None = None
    server_query_tokens: float | None = None
    ideal_share: float | None = None
    answers_share: float | None = None
    server_share: float | None = None


class ClientCheck(_Row, frozen=True, kw_only=True):
    """The client's own load over a run (analysis.signals.client_checks)."""

    run_id: str
    client_cpu_s: float | None = None
    client_cpu_share: float | None = None
    client_cpu_ms_per_1k_tokens: float | None = None
    arrival_ratio: float | None = None


class TtftCheck(_Row, frozen=True, kw_only=True):
    """Our TTFT beside vLLM's histogram, per run (analysis.signals.ttft_against_server)."""

    run_id: str
    client_ttft_p50_ms: float | None = None
    n_client: int | None = None
    server_ttft_p50_ms: float | None = None
    bucket_lo_ms: float | None = None
    bucket_hi_ms: float | None = None
    n_server: float | None = None
    ratio: float | None = None
    agrees: bool | None = None


class RequestCheck(_Row, frozen=True, kw_only=True):
    """Our TTFT against vLLM's per-request timings, per run (analysis.request_path.against_server)."""

    run_id: str
    n_ok: int | None = None
    n_timed: int | None = None
    front_end_p50_ms: float | None = None
    front_end_p90_ms: float | None = None
    front_end_p99_ms: float | None = None
    front_end_max_ms: float | None = None
    n_server_longer: int | None = None
    server_share_p50: float | None = None


class TtftPart(_Row, frozen=True, kw_only=True):
    """A band of one role's TTFT, in parts (analysis.request_path.ttft_parts)."""

    run_id: str
    role: str | None = None
    q: float | None = None
    n_ok: int | None = None
    n_timed: int | None = None
    n_band: int | None = None
    ttft_q_ms: float | None = None
    ttft_ms: float | None = None
    dispatch_ms: float | None = None
    front_end_ms: float | None = None
    queue_ms: float | None = None
    prefill_ms: float | None = None


class SweepLine(msgspec.Struct, frozen=True, kw_only=True):
    """A run of a concurrency sweep: its concurrency, the run (its requests, failures and
    TTFT p50), its rates (TTFT p95, tokens/s) and vLLM's queue share of its TTFT (None: the
    server sent no timings)."""

    concurrency: int | None
    run: RunRow
    rates: RunRates
    queue_share: float | None = None
    label: str | None = None  # the diagnosis' (None: not diagnosed)
    sweep: str = ""  # the sweep it is a run of (a section may show several)
