"""The verdict on one compared figure, and the rules it is judged by."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from filledfirst.study import Compare


class Change(StrEnum):
    HIGHER = "higher"
    LOWER = "lower"
    SAME = "no significant change"
    NOT_COMPARABLE = "not comparable"  # one side measured nothing to compare


@dataclass(frozen=True)
class Rules:
    """When a difference counts (the config's `compare` section, or its defaults)."""

    knee_min_shift: float
    run_min_change: float
    confidence: float
    resamples: int
    seed: int = 0

    @classmethod
    def of(cls, section: Compare) -> Rules:
        return cls(knee_min_shift=section.knee_min_shift, run_min_change=section.run_min_change,
                   confidence=section.confidence, resamples=section.resamples)
