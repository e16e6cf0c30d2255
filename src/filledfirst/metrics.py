"""Every vLLM /metrics name filledfirst reads, defined once.

The scraper keeps every `vllm:` sample (PREFIX); the server's idle check, the signals and
the diagnosis pick theirs by the names below. Where vLLM has spelt one thing two ways,
the tuple holds both and every reader accepts either.
"""

from __future__ import annotations

PREFIX = "vllm:"

RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
# vLLM renamed the KV gauge; older builds expose the gpu_ name (also on the CPU). Both are
# the used fraction (0-1) of the KV cache.
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
# The counter's sample name carries `_total`; a scraper that stores the family name keeps
# it without. `_created` (a timestamp) must never match, hence an explicit list.
PREEMPTIONS = ("vllm:num_preemptions_total", "vllm:num_preemptions")
# An info gauge: each engine's cache settings (block_size, num_gpu_blocks, ...) as labels.
CACHE_CONFIG_INFO = "vllm:cache_config_info"
# Histograms (family names; their buckets are `<name>_bucket`).
TTFT_HISTOGRAM = "vllm:time_to_first_token_seconds"
QUEUE_TIME_HISTOGRAM = "vllm:request_queue_time_seconds"

# The scraper's own health, stored beside the server's samples.
SCRAPE_SECONDS = "filledfirst:scrape_duration_seconds"
SCRAPE_ERROR = "filledfirst:scrape_error"


def sql_list(names: tuple[str, ...]) -> str:
    """`'a', 'b'` for `metric IN (...)`. Constant names from this module, never user
    input: safe to inline."""
    return ", ".join("'" + n.replace("'", "''") + "'" for n in names)
