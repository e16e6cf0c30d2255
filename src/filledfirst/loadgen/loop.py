"""The event loop a replay runs on: uvloop where it is installed (vLLM brings it along),
else asyncio's own. Measured side by side against the test double in one run
(benchmarks/README.md, client_fidelity.py --loop both): see there for what it saves."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)
