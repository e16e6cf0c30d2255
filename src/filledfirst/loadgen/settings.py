"""How a replay talks to a server: everything it needs besides the schedule."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ReplaySettings:
    """How to talk to the server: everything the replay needs besides the schedule."""

    model: str
    token_low: int
    token_high: int
    seed: int = 0
    request_timeout_s: float = 600.0
    drain_timeout_s: float = 600.0
    scrape_interval_s: float = 0.25
    api_key: str | None = None  # from the environment only; never written anywhere
    mode: str = "open"
    concurrency: int | None = None
    connect_timeout_s: float | None = None
    first_token_timeout_s: float | None = None
    api: str = "completions"  # or "chat"
    prompt: str = "token_ids"  # or "text", for servers that refuse token ids (and chat)

    @classmethod
    def from_spec(cls, spec: dict) -> "ReplaySettings":
        loadgen = spec["loadgen"]
        return cls(
            model=spec["model"]["name"],
            token_low=spec["model"]["prompt_token_ids"]["low"],
            token_high=spec["model"]["prompt_token_ids"]["high"],
            seed=loadgen.get("seed", 0),
            request_timeout_s=loadgen.get("request_timeout_s", 600),
            drain_timeout_s=loadgen.get("drain_timeout_s", 600),
            scrape_interval_s=spec["scrape"].get("interval_s", 0.25),
            mode=loadgen.get("mode", "open"),
            concurrency=loadgen.get("concurrency"),
            connect_timeout_s=loadgen.get("connect_timeout_s"),
            first_token_timeout_s=loadgen.get("first_token_timeout_s"),
            api=loadgen.get("api", "completions"),
            prompt=loadgen.get("prompt", "token_ids"),
        )
