"""Whether a fixed KV budget (kv_tokens, num_gpu_blocks_override) fits a GPU, checked
before the server starts: the weights (the model folder's weight files) and the budget's
KV (its tokens x the bytes each token keeps, from config.json and the dtype served)
against the card's memory x gpu_memory_utilization, vLLM's share of it. A tensor-parallel
server splits both over its GPUs. vLLM also keeps room for activations and CUDA graphs,
which it measures at start-up: a budget that fits here can still miss by that much, and
vLLM then says so itself; one that does not fit here never starts, and the error says by
how much and what would."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from filledfirst.model.kv import block_size, kv_blocks, kv_bytes_per_token, kv_shape, model_config

# vLLM's gpu_memory_utilization when none is given.
VLLM_MEMORY_SHARE = 0.9
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")
GIB = 2**30


def weights_bytes(folder: str | Path) -> int | None:
    """The model folder's weight files, in bytes (None: none there)."""
    files = [f for pattern in WEIGHT_PATTERNS for f in Path(folder).glob(pattern)]
    return sum(f.stat().st_size for f in files) if files else None


def kv_fit_problem(folder: str | Path | None, dtype: str | None, settings: Mapping[str, Any],
                   card_bytes: float, card: str = "the GPU") -> str | None:
    """Why the setting's fixed KV budget cannot fit `card_bytes` of one GPU (the smallest
    of the server's), with the arithmetic; None when it fits, when the setting leaves the
    KV to vLLM, or when the weights or the bytes per token are not known here."""
    blocks = kv_blocks("gpu", settings)
    if blocks is None or folder is None:
        return None
    shape = kv_shape(model_config(folder))
    per_token, _ = kv_bytes_per_token(shape["elements_per_token"], shape["why"], shape["config_dtype"], dtype,
                                      settings.get("kv_cache_dtype"))
    weights = weights_bytes(folder)
    if per_token is None or weights is None:
        return None
    gpus = int(settings.get("tensor_parallel_size") or 1)
    share = float(settings.get("gpu_memory_utilization") or VLLM_MEMORY_SHARE)
    tokens = blocks * block_size("gpu", settings)
    kv, room = tokens * per_token / gpus, share * card_bytes
    need = weights / gpus + kv
    if need <= room:
        return None
    fits = max(0, int((room - weights / gpus) * gpus / per_token))
    split = f" per GPU of {gpus}" if gpus > 1 else ""
    return (f"the KV budget does not fit {card}: {tokens:,} tokens x {per_token / 1024:.0f} KiB = {kv / GIB:.1f} GiB "
            f"of KV + {weights / gpus / GIB:.1f} GiB of weights{split} = {need / GIB:.1f} GiB, above "
            f"gpu_memory_utilization {share:g} x {card_bytes / GIB:.1f} GiB = {room / GIB:.1f} GiB; at most "
            f"{fits:,} tokens fit beside the weights (kv_tokens), or use a larger card or more of them "
            "(tensor_parallel_size)")
