"""llama.cpp's server (`llama-server --metrics`) metric names, read from its source
(tools/server/server-task.cpp `to_metrics`, server-context.cpp) and checked against the
tree llama-cpp-python 0.3.36 vendors.

A slot is a sequence: `--parallel N` slots are the cap (`requests_processing` counts the
busy ones, `requests_deferred` the requests that found none free). llama.cpp removed its
KV usage gauge: how full a slot's context is shows on `/slots` only. `n_decode_total`
counts llama_decode calls, its steps; `tokens_predicted_total` rises when a request ends,
not as its tokens are made; `prompt_tokens_total` leaves out the tokens served from a
slot's cache (`prompt_tokens_cached_total`).
"""

from __future__ import annotations

from filledfirst.engines.names import EngineMetrics, Series

PREFIX = "llamacpp:"

METRICS = EngineMetrics(
    name="llamacpp", prefix=PREFIX,
    running=("llamacpp:requests_processing",),
    waiting=("llamacpp:requests_deferred",),
    kv_used=(), preemptions=(),
    steps=("llamacpp:n_decode_total",), step_tokens=(),
    prompt_computed=(Series("llamacpp:prompt_tokens_total"),),
    generated=(Series("llamacpp:tokens_predicted_total"),),
    kv_tokens=(), cache_info=(), ttft_histogram=None, queue_histogram=None,
    cannot=("KV use (no gauge: a slot's context fills per slot, on /slots)",
            "preemptions (a slot keeps its context)", "the server's own TTFT and queue time",
            "the tokens in each step"),
)
