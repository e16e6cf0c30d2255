"""How a number reads in the diagnosis's clues and the report's tables: one function per kind
of quantity, so a share or a count is written the same wherever it appears.

`missing` is what stands for a value the data does not have: `NA` in sentences and shares,
`DASH` in the report's signal cells (a signal that was not measured).
"""

from __future__ import annotations

NA = "n/a"
DASH = "—"  # a signal that was not measured (failed run, no ok request, no scrape)


def share(x: float | None, missing: str = NA) -> str:
    """A 0-1 share as a whole percentage: '42 %'."""
    return missing if x is None else f"{100 * x:.0f} %"


def change(x: float | None, missing: str = DASH) -> str:
    """A 0-1 change as a signed whole percentage: '+32 %', '-16 %'."""
    return missing if x is None else f"{100 * x:+.0f} %"


def percent(x: float | None, missing: str = DASH) -> str:
    """A value already in percent (KV use), one decimal: '42.5%'."""
    return missing if x is None else f"{x:.1f}%"


def count(x: float | None, missing: str = DASH, grouped: bool = True) -> str:
    """Gauge medians can fall between two integers; show the half then, not a fake int.
    `grouped`: thousands separated by commas (tables), else plain (the clues)."""
    if x is None:
        return missing
    sep = "," if grouped else ""
    return f"{x:{sep}.0f}" if float(x).is_integer() else f"{x:{sep}.1f}"


def magnitude(x: float | None, missing: str = NA) -> str:
    """One decimal below 10, whole above: '3.1', '55'."""
    return missing if x is None else f"{x:.1f}" if abs(x) < 10 else f"{x:.0f}"


def ms(x: float | None, missing: str = DASH) -> str:
    """'13.1 ms' below 100 ms, '4,737 ms' above."""
    if x is None:
        return missing
    return f"{x:.1f} ms" if abs(x) < 100 else f"{x:,.0f} ms"


def seconds(x: float | None, missing: str = DASH) -> str:
    return missing if x is None else f"{x:,.1f} s"


def rps(x: float | None, missing: str = DASH) -> str:
    return missing if x is None else f"{x:,.3g} req/s"


def about(x: float) -> str:
    """A size quoted to two significant digits ('about 880', '3,600'), three below 1,000."""
    if not x:
        return "0"
    digits = 2 if x >= 1000 else 3
    return f"{float(f'{x:.{digits}g}'):,.0f}"
