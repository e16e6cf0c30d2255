"""SGLang's metric names (`python -m sglang.launch_server --enable-metrics`), read from
its source: python/sglang/srt/metrics/collector.py (newer trees:
srt/observability/metrics_collector.py) and managers/scheduler_metrics_mixin.py.

Its scheduler gauges are set at each prefill batch and every `--decode-log-interval` decode
steps (40 by default), every 30 s when idle, not at every scrape: between two updates a
gauge keeps its last value. `sglang:token_usage` is the used share (0-1) of the token pool
(max_total_num_tokens); cached prefix tokens no request holds count as free. Tokens are
counted by `sglang:realtime_tokens_total{mode=...}` at each log interval; its
prompt_tokens_total and generation_tokens_total move only when a request finishes.
No counter of forward passes that carries their tokens: no step time is fitted on it.
"""

from __future__ import annotations

from filledfirst.engines.names import EngineMetrics, Series

PREFIX = "sglang:"
REALTIME_TOKENS = "sglang:realtime_tokens_total"

METRICS = EngineMetrics(
    name="sglang", prefix=PREFIX,
    running=("sglang:num_running_reqs",),
    waiting=("sglang:num_queue_reqs",),
    kv_used=("sglang:token_usage",),
    preemptions=("sglang:num_retracted_requests_total",),
    steps=(), step_tokens=(),
    prompt_computed=(Series(REALTIME_TOKENS, "mode=prefill_compute"),),
    generated=(Series(REALTIME_TOKENS, "mode=decode"),),
    kv_tokens=("sglang:max_total_num_tokens",), cache_info=(),
    ttft_histogram="sglang:time_to_first_token_seconds",
    queue_histogram="sglang:queue_time_seconds",
    cannot=("engine steps and the tokens in each (no counter of them): no step budget label, no step-time fit",
            "its gauges move at each prefill batch and every 40 decode steps, not at every scrape"),
)
