"""Exact-size request bodies: prompts as token ids, so usage can be checked against what was asked."""

from __future__ import annotations

import json
import random

from filledfirst.records import ScheduledRequest


def completion_body(req: ScheduledRequest, *, model: str, low: int, high: int, seed: int) -> bytes:
    # A per-request generator keeps every prompt the same whatever else the schedule holds.
    rng = random.Random(f"{seed}:{req.request_id}")
    ids = [rng.randrange(low, high) for _ in range(req.prompt_tokens)]
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": req.output_tokens,
        "min_tokens": req.output_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        # Usage on every chunk: vLLM merges several tokens into one chunk when the client
        # lags, and the running completion count says how many each chunk carried.
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    return json.dumps(body, separators=(",", ":")).encode()
