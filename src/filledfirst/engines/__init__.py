"""The engines whose `/metrics` filledfirst reads, each a module of its own that names its
Prometheus series as the engine-neutral signals (`EngineMetrics`); filledfirst.metrics
puts them together, so the diagnosis, the search and the report read signals, never an
engine's names. A scrape keeps the samples of every engine listed here; a server speaks
one engine's names, so the signals of a run are that engine's.

A fourth engine is one module here that defines its EngineMetrics (what it cannot tell
left empty, and said in `cannot`), listed in ENGINES, and its tests on recorded pages.
"""

from __future__ import annotations

from filledfirst.engines import llamacpp, sglang, vllm
from filledfirst.engines.names import EngineMetrics

__all__ = ["ENGINES", "EngineMetrics"]

ENGINES: tuple[EngineMetrics, ...] = (vllm.METRICS, sglang.METRICS, llamacpp.METRICS)
