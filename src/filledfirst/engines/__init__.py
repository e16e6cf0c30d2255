"""The engines whose `/metrics` filledfirst reads, each a module of its own that names its
Prometheus series as the engine-neutral signals (`EngineMetrics`); filledfirst.metrics
puts them together, so the diagnosis, the search and the report read signals, never an
engine's names. A scrape keeps the samples of every engine listed here; a server speaks
one engine's names, so the signals of a run are that engine's.

A fourth engine is one module here that defines its EngineMetrics (what it cannot tell
left empty, and said in `cannot`), listed in ENGINES, and its tests on recorded pages.
"""

from __future__ import annotations

from typing import Any, Mapping

from filledfirst.engines import llamacpp, sglang, vllm
from filledfirst.engines.names import EngineMetrics

__all__ = ["ENGINES", "EngineMetrics", "settings_problem"]

ENGINES: tuple[EngineMetrics, ...] = (vllm.METRICS, sglang.METRICS, llamacpp.METRICS)

# The launchers whose engine takes only some of the study's (vLLM's) settings.
_SETTINGS_PROBLEM = {"llamacpp": llamacpp.settings_problem, "sglang": sglang.settings_problem}


def settings_problem(launcher: str, settings: Mapping[str, Any]) -> str | None:
    """Why the launcher's server cannot start with `settings` (None: it can), said when the
    config is read rather than when the server starts."""
    check = _SETTINGS_PROBLEM.get(launcher)
    return check(settings) if check is not None else None
