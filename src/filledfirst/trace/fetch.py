"""Get a trace file: from a local mirror folder when there is one, else from its URL."""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import BinaryIO

from filledfirst.atomic import atomic_path
from filledfirst.errors import UserError

log = logging.getLogger(__name__)

MIRROR_ENV = "FILLEDFIRST_TRACE_MIRROR"
_CHUNK = 1 << 20
_TIMEOUT_S = 60


def fetch_trace(entry: dict, out: Path) -> None:
    """`entry` is one item of the config's `traces` catalog: {url, file, sha256?, size?}."""
    out = Path(out)
    found = find_in_mirror(entry["file"])
    if found is not None:
        log.info("copying %s from the mirror (%s) to %s", entry["file"], found, out)
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


def _download(entry: dict, out: Path) -> None:
    url = entry["url"]
    log.info("downloading %s to %s", url, out)
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as resp:
            _copy_checked(resp, out, entry, origin=url, total=_content_length(resp))
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        raise UserError(
            f"could not download trace {entry['file']} from {url}: {exc}. "
            f"On a machine without internet access, put {entry['file']} in a folder "
            f"(any depth) and set {MIRROR_ENV} to that folder."
        ) from None


def _content_length(resp) -> int | None:
    value = resp.headers.get("Content-Length") if hasattr(resp, "headers") else None
    return int(value) if value and value.isdigit() else None


def _copy_checked(
    src: BinaryIO, out: Path, entry: dict, *, origin: str, total: int | None = None
) -> None:
    """Stream into a temp file beside `out`, hashing on the way; rename only if it checks."""
    digest = hashlib.sha256()
    copied = 0
    next_report = 0.1
    with atomic_path(out, ".partial") as tmp:
        with tmp.open("wb") as dst:
            while chunk := src.read(_CHUNK):
                dst.write(chunk)
                digest.update(chunk)
                copied += len(chunk)
                if total and copied / total >= next_report:
                    log.info("%s: %.0f%% of %.1f MB", entry["file"], 100 * copied / total, total / 1e6)
                    next_report += 0.1
        _check(entry, origin, copied, digest.hexdigest())
    log.info("%s: %d bytes, sha256 %s", out, copied, digest.hexdigest())


def _check(entry: dict, origin: str, size: int, sha256: str) -> None:
    expected = entry.get("sha256")
    if expected and expected != sha256:
        raise UserError(
            f"sha256 mismatch for {entry['file']} from {origin}: expected {expected}, got {sha256}"
        )
    if entry.get("size") is not None and entry["size"] != size:
        raise UserError(
            f"size mismatch for {entry['file']} from {origin}: expected {entry['size']} bytes, got {size}"
        )

