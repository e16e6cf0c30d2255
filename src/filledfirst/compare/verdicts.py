"""The verdict on one compared figure (what counts as a difference is the config's
`compare` section, filledfirst.study.Compare)."""

from __future__ import annotations

from enum import StrEnum


class Change(StrEnum):
    HIGHER = "higher"
    LOWER = "lower"
    SAME = "no significant change"
    NOT_COMPARABLE = "not comparable"  # one side measured nothing to compare

