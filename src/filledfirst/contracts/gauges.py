"""The scheduler's state from one scrape: what the idle check and the live progress line
read (filledfirst.metrics.latest_gauges builds it; the signals' SQL computes the same
values per scrape from the stored samples)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gauges:
    """Summed over engines (kv_pct: the fullest engine's), None where a value was not a
    finite number or the page had none."""

    running: float | None
    waiting: float | None
    kv_pct: float | None

    def idle(self) -> bool:
        return self.running == 0 and self.waiting == 0

    def __str__(self) -> str:
        return (f"running {_shown(self.running, '.0f')}  waiting {_shown(self.waiting, '.0f')}  "
                f"KV {_shown(self.kv_pct, '.1f')}%")


def _shown(value: float | None, spec: str) -> str:
    return "?" if value is None else format(value, spec)
