"""The rate of a run of arrivals, defined once (in Python and as SQL).

n arrivals from the first to the last span n - 1 gaps, so the rate is (n - 1) / span:
exact for evenly spaced arrivals and the unbiased estimate for Poisson ones, where n /
span reads ten arrivals 1 s apart as 1.11 per second. One arrival (or none, or all at
one instant) has no rate: None / NULL, never a division by zero.

A count inside a window of given length (a trace window's requests over its minutes) is
another quantity: n / length, since the window, not the arrivals, sets the span.
"""

from __future__ import annotations


def arrival_rate(n: int, span_s: float) -> float | None:
    """Arrivals per second of `n` arrivals whose first and last are `span_s` apart."""
    return (n - 1) / span_s if n > 1 and span_s > 0 else None


def arrival_rate_sql(t: str) -> str:
    """The same as an SQL aggregate over the arrival times in column `t` (NULLs ignored)."""
    return f"(count({t}) - 1) / nullif(max({t}) - min({t}), 0)"
