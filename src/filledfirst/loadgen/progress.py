"""One live line while a run goes: sent / done / failed and what the scheduler holds."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Callable

from rich.console import Console
from rich.live import Live
from rich.text import Text

log = logging.getLogger(__name__)


async def show_progress(status_line: Callable[[], str], stop: asyncio.Event, interactive: bool | None = None) -> None:
    """Redraw in place on a terminal; in a log file (Snakemake, batch jobs) one line per 10 s."""
    interactive = sys.stderr.isatty() if interactive is None else interactive
    if interactive:
        with Live(Text(status_line()), console=Console(stderr=True), refresh_per_second=4, transient=False) as live:
            while not stop.is_set():
                live.update(Text(status_line()))
                await _sleep_or_stop(stop, 0.25)
            live.update(Text(status_line()))
        return
    while not stop.is_set():
        if await _sleep_or_stop(stop, 10.0):
            break
        log.info(status_line())
    log.info(status_line())


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
        return True
    except asyncio.TimeoutError:
        return False
