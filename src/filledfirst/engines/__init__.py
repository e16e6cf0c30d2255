"""The engines whose `/metrics` filledfirst reads, each a module of its own that names its
Prometheus series as the engine-neutral signals (`EngineMetrics`); filledfirst.metrics
puts them together, so the diagnosis, the search and the report read signals, never an
engine's names. A scrape keeps the samples of every engine listed here; a server speaks
one engine's names, so the signals of a run are that engine's.

A fourth engine is one module here that defines its EngineMetrics (what it cannot tell
left empty, and said in `cannot`), listed in ENGINES, and its tests on recorded pages.
"""

from __future__ import annotations

from dataclasses import dataclass

from filledfirst.engines import llamacpp, sglang, vllm
from filledfirst.engines.names import EngineMetrics

__all__ = ["ENGINES", "EngineMetrics", "detect", "by_name"]

ENGINES: tuple[EngineMetrics, ...] = (vllm.METRICS, sglang.METRICS, llamacpp.METRICS)


def by_name(name: str) -> EngineMetrics:
    for engine in ENGINES:
        if engine.name == name:
            return engine
    raise KeyError(f"no engine {name!r} ({', '.join(e.name for e in ENGINES)})")


@dataclass(frozen=True)
class Detected:
    engine: EngineMetrics | None
    why: str


def detect(page: str) -> Detected:
    """Which engine served a `/metrics` page: the one whose prefix its samples carry most."""
    counts = {e.name: 0 for e in ENGINES}
    for line in page.splitlines():
        if line and not line.startswith("#"):
            for e in ENGINES:
                if line.startswith(e.prefix):
                    counts[e.name] += 1
    best = max(counts, key=lambda n: counts[n])
    if counts[best] == 0:
        names = ", ".join(f"{e.prefix}*" for e in ENGINES)
        return Detected(None, f"no sample of a known engine ({names})")
    return Detected(by_name(best), f"{counts[best]} {by_name(best).prefix}* samples")
