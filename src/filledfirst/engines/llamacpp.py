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

from typing import Any, Mapping

from filledfirst.engines.names import EngineMetrics, Series, unsupported

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


# -- Starting it ----------------------------------------------------------------------------
# The study's settings are vLLM's words for the limits every engine has; llama-server's
# flags for them. A slot is a sequence (the cap); `-c` is the context of all slots
# together, split evenly across them (the KV budget in tokens); `-b` the tokens one decode
# call takes at most (the step budget; a longer prompt is fed in pieces of it).
COMMAND = "llama-server"
CAP_FLAG = "--parallel"
CONTEXT_FLAG = "--ctx-size"
BATCH_FLAG = "--batch-size"
UBATCH_FLAG = "--ubatch-size"
UBATCH_DEFAULT = 512  # llama.cpp's physical batch; never above the logical one
# Settings of vLLM's own that llama-server has nothing for.
VLLM_ONLY = ("max_num_active_seqs", "enable_chunked_prefill", "gpu_memory_utilization", "block_size",
             "tensor_parallel_size", "kv_cache_space_gib", "enforce_eager")


def gguf_file(folder: str) -> str:
    """The GGUF file llama-server reads for a model whose weights are in `folder`: the folder
    itself when it is a .gguf file, else the file written beside it (`filledfirst model gguf`)."""
    return folder if folder.endswith(".gguf") else folder.rstrip("/") + ".gguf"


def settings_problem(settings: Mapping[str, Any]) -> str | None:
    """Why llama-server cannot start with these settings (None: it can)."""
    if settings.get("max_num_seqs") is None:
        return ("state max_num_seqs for the llamacpp launcher: it is llama-server's slot count "
                f"({CAP_FLAG}), the cap every label of a run is read against")
    return unsupported("llama.cpp's server", settings, VLLM_ONLY)


def server_argv(*, binary: str, gguf: str, name: str, host: str, port: int, seed: int, max_model_len: int,
                settings: dict, kv_tokens: int | None) -> list[str]:
    """llama-server's command line for a server setting. The cap and the context are always
    passed (so the run records what the server ran with); without a KV budget each slot
    holds one request of max_model_len. A relaxed cap keeps the context, so each slot then
    holds less of it."""
    if why := settings_problem(settings):
        raise ValueError(why)
    cap = settings["max_num_seqs"]
    context = kv_tokens if kv_tokens is not None else int(cap) * max_model_len
    argv = [binary, "--model", gguf, "--alias", name, "--host", host, "--port", str(port),
            "--seed", str(seed), "--metrics", "--slots", "--no-warmup",
            CAP_FLAG, str(cap), CONTEXT_FLAG, str(context)]
    batch = settings.get("max_num_batched_tokens")
    if batch is not None:
        argv += [BATCH_FLAG, str(batch), UBATCH_FLAG, str(min(int(batch), UBATCH_DEFAULT))]
    if settings.get("enable_prefix_caching") is not None:
        argv.append("--cache-prompt" if settings["enable_prefix_caching"] else "--no-cache-prompt")
    return argv + list(settings.get("extra_args") or [])
