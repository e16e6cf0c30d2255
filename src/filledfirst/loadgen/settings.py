"""How a replay talks to a server: everything it needs besides the schedule."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from filledfirst.study import LOADGEN, SCRAPE, ExperimentSpec


@dataclass(slots=True)
class ReplaySettings:
    """How to talk to the server: everything the replay needs besides the schedule."""

    model: str
    token_low: int
    token_high: int
    # Defaults: the config schema's (filledfirst.study), for a replay outside a study.
    seed: int = LOADGEN.seed
    request_timeout_s: float = LOADGEN.request_timeout_s
    drain_timeout_s: float = LOADGEN.drain_timeout_s
    scrape_interval_s: float = SCRAPE.interval_s
    api_key: str | None = None  # from the environment or the server's own command; never written anywhere
    mode: str = LOADGEN.mode
    concurrency: int | None = LOADGEN.concurrency
    connect_timeout_s: float | None = LOADGEN.connect_timeout_s
    first_token_timeout_s: float | None = LOADGEN.first_token_timeout_s
    api: str = LOADGEN.api  # or "chat"
    prompt: str = LOADGEN.prompt  # or "text", for servers that refuse token ids (and chat)
    workers: int | str = LOADGEN.workers  # processes, or "auto" (filledfirst.loadgen.workers)
    # Sent with prompts made of prefix blocks: a run's own, so it starts with a cold cache
    # even on a server an earlier run used (filledfirst.loadgen.prompts).
    # One per replay (all its worker processes share it), so requests of a run still share
    # blocks with each other.
    cache_salt: str | None = field(default_factory=lambda: secrets.token_hex(8))

    @classmethod
    def from_spec(cls, spec: ExperimentSpec) -> "ReplaySettings":
        """From an experiment's spec (filledfirst.config.experiment_spec): its merged
        loadgen and scrape sections."""
        loadgen, ids = spec.loadgen, spec.model.prompt_token_ids
        return cls(
            model=spec.model.name,
            token_low=ids.low,
            token_high=ids.high,
            seed=loadgen.seed,
            request_timeout_s=loadgen.request_timeout_s,
            drain_timeout_s=loadgen.drain_timeout_s,
            scrape_interval_s=spec.scrape.interval_s,
            mode=loadgen.mode,
            concurrency=loadgen.concurrency,
            connect_timeout_s=loadgen.connect_timeout_s,
            first_token_timeout_s=loadgen.first_token_timeout_s,
            api=loadgen.api,
            prompt=loadgen.prompt,
            workers=loadgen.workers,
        )
