"""What an engine module gives: its Prometheus names for each engine-neutral signal.

Each field is a tuple of names (empty: the engine does not expose it; several: it has spelt
one thing more than one way, and every reader accepts any). Counters are listed by their
sample names; a counter split by a label names the label its samples need (`Series`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class Series:
    """One counter's samples: its name and, where the engine splits it by a label, the
    `key=value` its samples carry."""

    metric: str
    label: str | None = None


@dataclass(frozen=True)
class EngineMetrics:
    name: str  # as a run records it (run.json server.engine) and as the docs name it
    prefix: str  # every sample of this engine's starts with it: what the scraper keeps
    running: tuple[str, ...]  # gauge: requests in the running batch (sequences the scheduler runs)
    waiting: tuple[str, ...]  # gauge: requests waiting for the scheduler to admit them
    kv_used: tuple[str, ...]  # gauge: the used share (0-1) of the KV pool
    preemptions: tuple[str, ...]  # counter: requests put back to wait because KV ran out
    steps: tuple[str, ...]  # counter: engine steps (forward passes)
    step_tokens: tuple[str, ...]  # counter: the tokens those steps carried
    prompt_computed: tuple[Series, ...]  # counter: prompt tokens computed (not served from a cache)
    generated: tuple[Series, ...]  # counter: tokens generated
    kv_tokens: tuple[str, ...]  # gauge: the KV pool's size in tokens, where the engine says it as a number
    cache_info: tuple[str, ...]  # info gauge whose labels carry num_gpu_blocks and block_size (vLLM's)
    ttft_histogram: str | None  # the server's time to first token, seconds (family name)
    queue_histogram: str | None  # the server's time a request waited to be scheduled, seconds
    cannot: tuple[str, ...] = ()  # what its metrics do not tell, in the report's words


def unsupported(engine: str, settings: Mapping[str, Any], vllm_only: tuple[str, ...]) -> str | None:
    """Why an engine cannot start with `settings`: the vLLM settings among them it has
    nothing for (refused, not ignored, so a study never believes it measured a setting the
    server was not started with). None: it can."""
    given = sorted(k for k in vllm_only if settings.get(k) not in (None, False))
    if not given:
        return None
    return (f"{engine} has no setting for {', '.join(given)} (vLLM's): remove "
            f"{'it' if len(given) == 1 else 'them'} from the study's settings for this launcher")
