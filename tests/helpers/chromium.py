"""Headless Chromium for the tests that open a report in a real browser, with no network:
the browser run, a screenshot for a human, and which `ff-chart` divs got an <svg>.
(The `chromium` fixture of tests/conftest.py skips or, in CI, fails without it.)"""

from __future__ import annotations

import subprocess
from html.parser import HTMLParser
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")


def chromium_run(*args: str, profile: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    argv = [
        str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        # No network: every request goes to a proxy that does not exist.
        "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
        # The page's console messages reach stderr as INFO:CONSOLE lines.
        "--enable-logging=stderr", "--v=0",
        f"--user-data-dir={profile}", "--virtual-time-budget=15000", *args,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=True)


def screenshot(html: Path, png: Path, profile: Path, height: int = 5000) -> Path:
    """A full-page PNG of the report, for a human to look at (never committed)."""
    png.parent.mkdir(parents=True, exist_ok=True)
    chromium_run(f"--screenshot={png}", f"--window-size=1100,{height}", html.as_uri(), profile=profile)
    return png


class ChartDivs(HTMLParser):
    """For each `ff-chart` div: did an <svg> appear inside it? (Chromium's DOM dump has
    balanced div tags, so a stack of open divs is enough.)"""

    def __init__(self) -> None:
        super().__init__()
        self.charts: dict[str, bool] = {}
        self._open: list[str | None] = []  # chart id for chart divs, else None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div":
            is_chart = "ff-chart" in (a.get("class") or "").split()
            if is_chart:
                self.charts.setdefault(a["id"], False)
            self._open.append(a["id"] if is_chart else None)
        elif tag == "svg":
            for cid in filter(None, self._open):
                self.charts[cid] = True

    def handle_endtag(self, tag):
        if tag == "div" and self._open:
            self._open.pop()
