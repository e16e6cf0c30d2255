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

from typing import Any, Mapping

from filledfirst.engines.names import EngineMetrics, Series, unsupported

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


# -- Starting it ----------------------------------------------------------------------------
# The study's settings are vLLM's words; SGLang's flags for the same limits (its server_args.py).
# Its token pool is counted in tokens (a page of one token unless --page-size says more).
MODULE = "sglang.launch_server"
NAME = "SGLang"  # as its log lines and errors name it
_VALUE_FLAGS = {
    "max_num_seqs": "--max-running-requests",
    "max_num_batched_tokens": "--chunked-prefill-size",
    "gpu_memory_utilization": "--mem-fraction-static",
    "tensor_parallel_size": "--tp-size",
}
VLLM_ONLY = ("max_num_active_seqs", "enable_chunked_prefill", "block_size", "kv_cache_space_gib")


def settings_problem(settings: Mapping[str, Any]) -> str | None:
    """Why SGLang cannot start with these settings (None: it can)."""
    return unsupported(NAME, settings, VLLM_ONLY)


def server_argv(*, python: str, folder: str, name: str, host: str, port: int, seed: int, dtype: str,
                max_model_len: int, settings: dict, kv_tokens: int | None) -> list[str]:
    """SGLang's command line for a server setting: its metrics on, its cap, token pool and
    prefill chunk from the study's settings (its own defaults where they are unset)."""
    if why := settings_problem(settings):
        raise ValueError(why)
    argv = [python, "-m", MODULE, "--model-path", folder, "--served-model-name", name, "--host", host,
            "--port", str(port), "--dtype", dtype, "--context-length", str(max_model_len),
            "--random-seed", str(seed), "--enable-metrics"]
    for key, flag in _VALUE_FLAGS.items():
        if settings.get(key) is not None:
            argv += [flag, str(settings[key])]
    if kv_tokens is not None:
        argv += ["--max-total-tokens", str(kv_tokens)]
    if settings.get("enable_prefix_caching") is False:
        argv.append("--disable-radix-cache")
    if settings.get("enforce_eager"):
        argv.append("--disable-cuda-graph")
    return argv + list(settings.get("extra_args") or [])
