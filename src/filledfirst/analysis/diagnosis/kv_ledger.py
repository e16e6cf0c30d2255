"""The KV ledger: how many bytes a token's KV takes, how many tokens the engines' caches
hold, and how many requests of the workload's mean length fit in them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from filledfirst.contracts.runmeta import RunMeta
from filledfirst.model.kv import kv_bytes_per_token


@dataclass(frozen=True)
class KvLedger:
    bytes_per_token: float | None
    capacity_tokens: float | None
    fit_concurrency: float | None


def kv_ledger(cache_labels: list[str] | None, mean_tokens: float | None, meta: RunMeta) -> tuple[KvLedger, str]:
    """Seed 004's ledger from every engine's cache settings (`cache_labels`: the label
    strings of vLLM's cache_config_info at the last scrape that had them). What the engines
    report comes first (capacity in tokens, and bytes per token as their KV memory over
    those tokens); else bytes per token from the model's shape run.json recorded
    (filledfirst.model.kv). NULL where it is not known, never a wrong number; the second
    value says why bytes per token is not known ("" when it is, or was not looked for)."""
    engines = cache_labels or []
    tokens = [_engine_tokens(labels) for labels in engines]
    memory = [_label_int(labels, "kv_cache_memory_bytes") for labels in engines]
    capacity = float(sum(tokens)) if engines and None not in tokens else None  # type: ignore[arg-type]
    per_token: float | None
    why = ""
    if capacity and None not in memory:
        per_token = sum(memory) / capacity  # type: ignore[arg-type]
    else:
        cache_dtypes = {_label_value(labels, "cache_dtype") for labels in engines} - {None}
        per_token, why = _kv_bytes_per_token(meta, next(iter(cache_dtypes)) if len(cache_dtypes) == 1 else None)
    return KvLedger(bytes_per_token=per_token, capacity_tokens=capacity,
                    fit_concurrency=capacity / mean_tokens if capacity and mean_tokens else None), why


def _label_value(labels: str | None, key: str) -> str | None:
    m = re.search(rf"(?:^|,){key}=([^,]*)", labels or "")
    return m.group(1) if m else None


def _label_int(labels: str, key: str) -> int | None:
    value = _label_value(labels, key)
    return int(value) if value is not None and value.isdigit() else None


def _engine_tokens(labels: str) -> int | None:
    tokens = _label_int(labels, "kv_cache_size_tokens")
    blocks, block_size = _label_int(labels, "num_gpu_blocks"), _label_int(labels, "block_size")
    return tokens if tokens is not None else blocks * block_size if blocks is not None and block_size else None


def _kv_bytes_per_token(meta: RunMeta, cache_dtype: str | None) -> tuple[float | None, str]:
    """Bytes per token from the model's KV shape the run recorded when it started."""
    if meta.kv is None:
        return None, "the run recorded no KV shape (made by an older version)"
    return kv_bytes_per_token(meta.kv.elements_per_token, meta.kv.why, meta.kv.config_dtype, meta.model.dtype,
                              cache_dtype)
