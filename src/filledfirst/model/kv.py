"""KV-cache bytes per token from a model's config.json: its shape is read when a run starts
(the model folder is at hand then) and kept in run.json, so the diagnosis reads no model
folder.

Only for the families whose KV is plain per-token K and V (2 x layers x KV heads x head
dim x dtype bytes), or MLA's one latent and rope key per layer; everything else is None
with the reason, never a wrong number. What the engine itself reports (its KV memory over
its KV tokens) comes first in the diagnosis; this is the fallback.

A KV budget given in tokens (the `kv_tokens` server setting) becomes the engine's block
count here too (`kv_blocks`), so that a budget means the same tokens on any machine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from filledfirst.study import model_folder

# fp8 variants with other layouts (e.g. fp8_ds_mla) are left unknown rather than guessed.
_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
                "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
# config.json keys of models whose layers do not all keep K and V per token: linear
# attention or state-space layers (a fixed state), layers sharing another's KV.
_NOT_PER_TOKEN_KEYS = ("layers_block_type", "attn_type_list", "full_attention_interval", "num_kv_shared_layers",
                       "kv_sharing_target_layer_name", "mamba_d_state", "linear_attn_config")


def model_config(path: str | Path | None) -> dict | None:
    """A model folder's config.json, None if there is none. A relative path is the working
    directory's, as it is for the vLLM started from it."""
    if not path:
        return None
    found = Path(path) / "config.json"
    return json.loads(found.read_text()) if found.is_file() else None


def kv_shape(top: dict | None) -> dict[str, Any]:
    """What run.json keeps of a model's config.json (`top`) for the KV ledger: the KV
    elements each token keeps over all layers, the config's own dtype, and why the
    elements are not known (None when they are)."""
    if top is None:
        return {"elements_per_token": None, "config_dtype": None, "why": "no local model config.json"}
    cfg = top.get("text_config") or top  # multimodal wrappers keep the language model's shape here
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or top.get("torch_dtype") or top.get("dtype")
    out: dict[str, Any] = {"elements_per_token": None, "config_dtype": dtype, "why": None}
    layer_types = set(cfg.get("layer_types") or ())
    if layer_types - {"full_attention", "attention"} or any(k in cfg for k in _NOT_PER_TOKEN_KEYS):
        return out | {"why": f"{cfg.get('model_type', 'this model')}: hybrid, linear-attention or shared-KV layers"}
    try:
        layers = cfg["num_hidden_layers"]
        if cfg.get("kv_lora_rank"):  # MLA: one compressed latent and the rope key per layer
            return out | {"elements_per_token": float(layers * (cfg["kv_lora_rank"] + cfg.get("qk_rope_head_dim", 0)))}
        heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        return out | {"elements_per_token": float(2 * layers * (cfg.get("num_key_value_heads") or heads) * head_dim)}
    except (KeyError, TypeError, ZeroDivisionError) as exc:
        return out | {"why": f"config.json lacks {exc}"}


def kv_record(model: dict[str, Any] | None) -> dict[str, Any]:
    """run.json's `kv` for a run's model (read from the folder it is served from)."""
    try:
        return kv_shape(model_config(model_folder(model or {})))
    except (OSError, ValueError) as exc:
        why = f"config.json unreadable: {type(exc).__name__}"
        return {"elements_per_token": None, "config_dtype": None, "why": why}


def kv_bytes_per_token(elements_per_token: float | None, why: str | None, config_dtype: str | None,
                       model_dtype: str | None, cache_dtype: str | None) -> tuple[float | None, str]:
    """Bytes per token, and why not when it cannot be told. The KV dtype: vLLM's
    kv_cache_dtype as the engine reports it, else the model dtype served (`auto`: the
    config's)."""
    if elements_per_token is None:
        return None, why or "the model's KV shape is not known"
    dtype = cache_dtype if cache_dtype not in (None, "auto") else model_dtype or "auto"
    if dtype == "auto":
        dtype = config_dtype
        if dtype in ("float32", "float"):
            return None, "dtype auto with a float32 config: vLLM picks 16 or 32 bits by platform"
    nbytes = _DTYPE_BYTES.get(str(dtype))
    if nbytes is None:
        return None, f"bytes of KV dtype {dtype} not known"
    return elements_per_token * nbytes, ""


# vLLM's KV block size when none is given (vllm.platforms: the CPU's, a CUDA GPU's);
# llama.cpp keeps its KV in cells of one token, SGLang in pages of one token.
DEFAULT_BLOCK_SIZE = {"cpu": 128, "gpu": 16, "llamacpp": 1, "sglang": 1}


def block_size(launcher: str, settings: Mapping[str, Any]) -> int:
    """Tokens per KV block of a server started with `settings`."""
    return int(settings.get("block_size") or DEFAULT_BLOCK_SIZE[launcher])


def kv_blocks(launcher: str, settings: Mapping[str, Any]) -> int | None:
    """The KV blocks a setting asks for: num_gpu_blocks_override, or its KV budget in
    tokens (kv_tokens) in whole blocks, rounded up (None: what the memory allows)."""
    if settings.get("kv_tokens") is not None:
        if settings.get("num_gpu_blocks_override") is not None:
            raise ValueError("kv_tokens and num_gpu_blocks_override both set the KV budget: give one")
        return -(-int(settings["kv_tokens"]) // block_size(launcher, settings))
    blocks = settings.get("num_gpu_blocks_override")
    return None if blocks is None else int(blocks)


def kv_budget_problem(launcher: str, settings: Mapping[str, Any], max_model_len: int) -> str | None:
    """Why vLLM would refuse to start with this KV budget (None: it fits one request of
    max_model_len tokens, which vLLM requires, in blocks beside the one it keeps back).
    llama.cpp's server and SGLang start on any budget: a request that cannot fit fails alone."""
    if launcher in ("llamacpp", "sglang"):
        return None
    try:
        blocks = kv_blocks(launcher, settings)
    except ValueError as exc:
        return str(exc)
    size = block_size(launcher, settings)
    need = -(-max_model_len // size) + 1
    if blocks is not None and blocks < need:
        return (f"{blocks} KV blocks of {size} tokens cannot hold one request of max_model_len "
                f"({max_model_len}): vLLM needs at least {need} ({need * size} kv_tokens)")
    return None
