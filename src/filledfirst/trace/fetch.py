"""Get a trace file: from a local mirror folder when there is one, else from its URL.

Downloads are streamed (a one-week trace is over a GB) with a progress bar on stderr,
resumable (an interrupted run leaves `<out>.part`; the next one asks for the rest with
an HTTP Range request) and checked (size, sha256) before the file gets its real name."""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import BinaryIO

import msgspec
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from filledfirst.atomic import atomic_path
from filledfirst.errors import UserError
from filledfirst.study import Trace

log = logging.getLogger(__name__)

MIRROR_ENV = "FILLEDFIRST_TRACE_MIRROR"
_CHUNK = 1 << 20
_TIMEOUT_S = 60


def fetch_trace(entry: Trace | dict, out: Path) -> None:
    """`entry` is one item of the config's `traces` catalog: {url, file, sha256?, size?}."""
    entry = entry if isinstance(entry, Trace) else msgspec.convert(entry, Trace)
    out = Path(out)
    found = find_in_mirror(entry.file)
    if found is not None:
        log.info("copying %s from the mirror (%s) to %s", entry.file, found, out)
        with found.open("rb") as src:
            _copy_checked(src, out, entry, origin=str(found))
        return
    _download(entry, out)


def find_in_mirror(file: str) -> Path | None:
    mirror = os.environ.get(MIRROR_ENV)
    if not mirror:
        return None
    root = Path(mirror)
    if not root.is_dir():
        log.warning("%s=%s is not a folder; ignoring it", MIRROR_ENV, mirror)
        return None
    # Sorted, so the same copy is picked every time when a mirror holds several.
    hits = sorted(p for p in root.rglob(Path(file).name) if p.is_file())
    if len(hits) > 1:
        log.warning("%d copies of %s under %s; using %s", len(hits), file, root, hits[0])
    return hits[0] if hits else None


def _download(entry: Trace, out: Path) -> None:
    """Stream `url` into `<out>.part`, resuming a `.part` left by an interrupted run with
    an HTTP Range request; verify size and sha256, and only then rename it onto `out`."""
    url = entry.url
    part = out.with_name(out.name + ".part")
    out.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.exists() else 0
    if entry.size is not None and have > entry.size:
        log.warning("%s is longer than %s should be; starting again", part, entry.file)
        have = 0
    digest = hashlib.sha256()
    if have:
        with part.open("rb") as fh:  # the kept bytes count in the checksum too
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
    log.info("downloading %s to %s%s", url, out, f" (resuming at byte {have:,})" if have else "")
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        try:
            resp = urllib.request.urlopen(request, timeout=_TIMEOUT_S)
        except urllib.error.HTTPError as exc:
            if exc.code != 416 or not have:  # 416: nothing after `have`, the .part is whole
                raise
            resp = None
        if resp is not None:
            with resp:
                if have and getattr(resp, "status", None) != 206:
                    log.warning("%s ignored the Range request; downloading all of it again", url)
                    have, digest = 0, hashlib.sha256()
                total = _content_length(resp)
                with part.open("r+b" if have else "wb") as dst:
                    dst.seek(have)
                    dst.truncate()
                    copied = _stream(resp, dst, digest, entry.file, have, None if total is None else have + total)
                if total is not None and copied < total:
                    # urllib's read(n) ends quietly on a dropped connection; the length tells.
                    raise ConnectionError(f"connection closed after {have + copied:,} of {have + total:,} bytes")
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        kept = part.stat().st_size if part.exists() else 0
        resume = f" {kept:,} bytes are kept in {part}; run again to resume." if kept else ""
        raise UserError(
            f"could not download trace {entry.file} from {url}: {exc}.{resume} "
            f"On a machine without internet access, put {entry.file} in a folder "
            f"(any depth) and set {MIRROR_ENV} to that folder."
        ) from None
    size = part.stat().st_size
    try:
        _check(entry, url, size, digest.hexdigest())
    except UserError:
        part.unlink()  # wrong bytes: resuming from them could never give the right file
        raise
    os.replace(part, out)
    log.info("%s: %d bytes, sha256 %s", out, size, digest.hexdigest())


def _content_length(resp) -> int | None:
    value = resp.headers.get("Content-Length") if hasattr(resp, "headers") else None
    return int(value) if value and value.isdigit() else None


def _stream(src: BinaryIO, dst: BinaryIO, digest, label: str, done: int, total: int | None) -> int:
    """Copy and hash in chunks, with a progress bar on stderr; returns the bytes copied."""
    copied = 0
    with Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), console=Console(stderr=True), transient=True,
    ) as bar:
        task = bar.add_task(label, total=total, completed=done)
        while chunk := src.read(_CHUNK):
            dst.write(chunk)
            digest.update(chunk)
            copied += len(chunk)
            bar.advance(task, len(chunk))
    return copied


def _copy_checked(src: BinaryIO, out: Path, entry: Trace, *, origin: str) -> None:
    """Stream into a temp file beside `out`, hashing on the way; rename only if it checks."""
    digest = hashlib.sha256()
    with atomic_path(out, ".partial") as tmp:
        with tmp.open("wb") as dst:
            copied = _stream(src, dst, digest, entry.file, 0, entry.size)
        _check(entry, origin, copied, digest.hexdigest())
    log.info("%s: %d bytes, sha256 %s", out, copied, digest.hexdigest())


def _check(entry: Trace, origin: str, size: int, sha256: str) -> None:
    expected = entry.sha256
    if expected and expected != sha256:
        raise UserError(
            f"sha256 mismatch for {entry.file} from {origin}: expected {expected}, got {sha256}"
        )
    if entry.size is not None and entry.size != size:
        raise UserError(
            f"size mismatch for {entry.file} from {origin}: expected {entry.size} bytes, got {size}"
        )
