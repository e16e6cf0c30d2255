"""Table `diagnosis`, typed: a row per run as the report reads it back (its label, clue,
warnings and the features they rest on; filledfirst.analysis.diagnosis.storage writes the
table and documents the columns). Built once where the table is read (`DiagnosisRow.read`)."""

from __future__ import annotations

from typing import Any

import msgspec


class DiagnosisRow(msgspec.Struct, frozen=True, kw_only=True):
    """A row of table `diagnosis` (a field per column, in the table's order)."""

    run_id: str
    experiment: str
    expect: str | None = None
    label: str | None = None
    clue: str | None = None
    then_filled: str | None = None
    warnings: str | None = None
    notes: str | None = None
    cap: int | None = None
    engines: int | None = None
    window_start_s: float | None = None
    window_end_s: float | None = None
    running_at_cap_share: float | None = None
    waiting_share: float | None = None
    window_running_median: float | None = None
    window_running_max: float | None = None
    window_kv_median_pct: float | None = None
    window_kv_max_pct: float | None = None
    kv_full_share: float | None = None
    window_waiting_median: float | None = None
    window_preemptions: float | None = None
    queue_time_p50_ms: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p90_ms: float | None = None
    ttft_timeouts: int | None = None
    failed_share: float | None = None
    lag_p99_ms: float | None = None
    first_crossings: str | None = None
    littles_L_server: float | None = None
    littles_lambda_W: float | None = None
    littles_ratio: float | None = None
    littles_ok: bool | None = None
    goodput_rps: float | None = None
    slo_met_share: float | None = None
    kv_bytes_per_token: float | None = None
    kv_capacity_tokens: float | None = None
    kv_fit_concurrency: float | None = None
    interference_ratio: float | None = None
    scrape_coverage: float | None = None
    window_scrapes: int | None = None
    window_queue_share: float | None = None
    window_timed: int | None = None
    interference_prefill_ratio: float | None = None
    client_cpu_share: float | None = None
    client_cpu_ms_per_1k_tokens: float | None = None
    arrival_ratio: float | None = None
    token_budget: int | None = None
    budget_queued_steps: int | None = None
    budget_fill: float | None = None
    prefix_caching: bool | None = None
    ideal_hit_share: float | None = None
    measured_hit_share: float | None = None
    cache_efficiency: float | None = None
    waited_request_s: float | None = None
    bound: str | None = None
    held_by: str | None = None
    step_ms: float | None = None
    prefill_share: float | None = None
    engine: str | None = None  # whose metrics its scrapes carry (filledfirst.engines)

    @classmethod
    def from_columns(cls, row: dict[str, Any]) -> DiagnosisRow:
        return msgspec.convert(row, cls)
