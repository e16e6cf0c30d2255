"""vLLM's metric names, defined once (vLLM V1, 0.10-0.32; `--enable-per-request-metrics`
from 0.32). Where vLLM has spelt one thing two ways, the tuple holds both. The per-request
timings a stream's last usage chunk carries are at the end.
"""

from __future__ import annotations

from filledfirst.engines.names import EngineMetrics, Series

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
GENERATION_TOKENS = ("vllm:generation_tokens_total", "vllm:generation_tokens")
# Prompt tokens by where they came from; `local_compute` is what the engine computed.
PROMPT_TOKENS_BY_SOURCE = ("vllm:prompt_tokens_by_source_total", "vllm:prompt_tokens_by_source")
PROMPT_COMPUTED_SOURCE = "local_compute"

METRICS = EngineMetrics(
    name="vllm", prefix=PREFIX, running=RUNNING, waiting=WAITING, kv_used=KV_USAGE, preemptions=PREEMPTIONS,
    steps=(ITERATION_TOKENS + "_count",), step_tokens=(ITERATION_TOKENS + "_sum",),
    prompt_computed=tuple(Series(n, f"source={PROMPT_COMPUTED_SOURCE}") for n in PROMPT_TOKENS_BY_SOURCE),
    generated=tuple(Series(n) for n in GENERATION_TOKENS), kv_tokens=(), cache_info=(CACHE_CONFIG_INFO,),
    ttft_histogram=TTFT_HISTOGRAM, queue_histogram=QUEUE_TIME_HISTOGRAM,
)

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
