"""Find a time window in a big time-sorted trace CSV (any format's columns) without reading the whole file.

The trace is sorted by time, so the window's first and last byte are found by bisecting
byte offsets: seek, skip to the next line start, read that line's timestamp. Only the
header and the window's bytes are then handed to polars. Time and memory grow with the
window, not the file (a one-week trace is 1.9 GB; a ten-minute window is a few MB).

Sortedness is only checked where it matters: the first line, the last line, every probed
line must be readable, the slice must be in order, and the lines just outside it must be
outside the window. Anything else raises `NotBisectable`, and the caller falls back to
reading the whole file, which then names every bad row precisely.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from filledfirst.trace.formats import OUTPUT, PROMPT, TIME, Format

_BOM = b"\xef\xbb\xbf"
_TAIL = 1 << 16  # longest line looked for when reading backwards
_WHOLE = re.compile(r"[0-9]+")


class NotBisectable(Exception):
    """The file cannot be bisected safely here; read it whole instead (the message says why)."""


class SortedCsv:
    """A trace CSV opened for bisecting by timestamp. Offsets are byte offsets of line starts."""

    def __init__(self, fh: BinaryIO, name: str, fmt: Format) -> None:
        if fmt.file_type(name) != "csv":
            raise NotBisectable("only a CSV is bisected")
        self._fh, self.name, self._fmt = fh, name, fmt
        self.size = os.fstat(fh.fileno()).st_size
        header = fh.readline()
        if not header.endswith(b"\n"):
            raise NotBisectable("no data line after the header")
        self.header = header.removeprefix(_BOM).rstrip(b"\r\n")
        self.data_start = fh.tell()
        names = [c.strip().strip('"') for c in self.header.decode("utf-8", "replace").split(",")]
        wanted = fmt.file_columns
        if any(c not in names for c in wanted.values()):
            raise NotBisectable(f"header {names} lacks {list(wanted.values())}")
        self._ncols, self._ts_col = len(names), names.index(wanted[TIME])
        self._size_cols = [names.index(wanted[c]) for c in (PROMPT, OUTPUT)]
        self.end = self._end_of_data()
        if self.end <= self.data_start:
            raise NotBisectable("no data line after the header")
        # The first and last rows set the window's origin and the span: they must be rows
        # the full scan would keep, or the two paths could disagree under --skip-bad.
        self.first_ns, _ = self.line_at(self.data_start, whole_row=True)
        self.last_ns, _ = self.line_at(self.prev_start(self.end), whole_row=True)
        if self.last_ns < self.first_ns:
            raise NotBisectable("the last line is earlier than the first")

    def _end_of_data(self) -> int:
        """Offset just past the last non-blank line (trailing blank lines are not rows)."""
        start = max(self.data_start, self.size - _TAIL)
        self._fh.seek(start)
        tail = self._fh.read(self.size - start)
        return start + len(tail.rstrip(b"\r\n"))

    def line_at(self, pos: int, whole_row: bool = False) -> tuple[int, int]:
        """(timestamp ns, offset of the next line) of the line starting at `pos`;
        `whole_row` also wants the token counts to be good (prompt >= 1, output >= 0)."""
        self._fh.seek(pos)
        line = self._fh.readline()
        fields = line.rstrip(b"\r\n").decode("utf-8", "replace").split(",")
        ts = (self._fmt.one_time_ns(fields[self._ts_col].strip().strip('"')) if len(fields) == self._ncols
              else None)
        if whole_row and ts is not None:
            prompt, output = (fields[i].strip() for i in self._size_cols)
            if not (_WHOLE.fullmatch(prompt) and _WHOLE.fullmatch(output) and int(prompt) >= 1):
                ts = None
        if ts is None:
            raise NotBisectable(f"unreadable line at byte {pos}: {line[:80]!r}")
        return ts, min(pos + len(line), self.end)

    def next_start(self, pos: int) -> int:
        """The first line start at or after `pos`."""
        if pos <= self.data_start:
            return self.data_start
        self._fh.seek(pos - 1)
        self._fh.readline()  # the rest of the line `pos - 1` is in
        return min(self._fh.tell(), self.end)

    def prev_start(self, pos: int) -> int:
        """The start of the line that ends just before line start `pos`."""
        lo = max(self.data_start, pos - _TAIL)
        self._fh.seek(lo)
        chunk = self._fh.read(pos - lo)
        cut = chunk.rstrip(b"\r\n").rfind(b"\n")
        if cut < 0 and lo > self.data_start:
            raise NotBisectable(f"a line longer than {_TAIL} bytes before byte {pos}")
        return lo + cut + 1

    def lower_bound(self, target_ns: int) -> int:
        """Offset of the first line whose timestamp is >= target_ns (`end` if none)."""
        lo, hi = self.data_start, self.end  # lines before lo are < target; hi is >= or end
        while lo < hi:
            line = self.next_start((lo + hi) // 2)
            if line >= hi:  # no line starts in the upper half: step from lo instead
                line = lo
            ts, nxt = self.line_at(line)
            if ts < target_ns:
                lo = nxt
            else:
                hi = line
        return lo

    def window_bytes(self, start_ns: int, end_ns: int) -> tuple[int, int, bytes]:
        """(first offset, end offset, header + the lines with start_ns <= t < end_ns)."""
        a = self.lower_bound(start_ns)
        b = self.lower_bound(end_ns) if a < self.end else a
        if b < a:
            raise NotBisectable("the window's end is before its start: the file is not in order")
        if a > self.data_start and self.line_at(self.prev_start(a))[0] >= start_ns:
            raise NotBisectable("the line before the window is not before it")
        if b < self.end and self.line_at(b)[0] < end_ns:
            raise NotBisectable("the line after the window is not after it")
        self._fh.seek(a)
        body = self._fh.read(b - a)
        if body and not body.endswith(b"\n"):
            body += b"\n"
        return a, b, self.header + b"\n" + body

    def line_counter(self, pos: int) -> Callable[[], int]:
        """A function giving the 1-based line number at `pos`; it reads the file up to
        `pos`, so it is only called when an error message needs it."""

        def count() -> int:
            newlines, left = 0, pos
            with open(self.name, "rb") as fh:  # our own handle: it may run after the bisect
                while left > 0 and (chunk := fh.read(min(left, 1 << 24))):
                    newlines += chunk.count(b"\n")
                    left -= len(chunk)
            return newlines + 1

        return count


def open_sorted(path: Path, fmt: Format) -> tuple[BinaryIO, SortedCsv]:
    """Open `path` for bisecting; the caller closes the returned file."""
    fh = path.open("rb")
    try:
        return fh, SortedCsv(fh, str(path), fmt)
    except BaseException:
        fh.close()
        raise
