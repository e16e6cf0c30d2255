"""Write outputs so an interrupted process never leaves a file that looks complete."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq


@contextmanager
def atomic_path(dest: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temp path beside `dest`; rename it onto `dest` only if the block succeeds."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.partial-", suffix=suffix, dir=dest.parent)
    os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would make results unreadable to others
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, dest)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def make_temp_dir(dest: Path) -> Path:
    """An empty folder beside `dest`, with normal permissions, to be published later."""
    for attempt in (1, 2):
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
            break
        except FileNotFoundError:  # another process removed the (empty) parent meanwhile
            if attempt == 2:
                raise
    tmp.chmod(0o777 & ~_umask())
    return tmp


def write_parquet(table: pa.Table, dest: str | os.PathLike) -> None:
    with atomic_path(dest, ".parquet") as tmp:
        pq.write_table(table, tmp)


def write_json(obj: object, dest: str | os.PathLike) -> None:
    with atomic_path(dest, ".json") as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_text(text: str, dest: str | os.PathLike) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_text(text)


@contextmanager
def atomic_dir(dest: str | os.PathLike) -> Iterator[Path]:
    """Build a directory under a temp name and swap it into place only on success."""
    dest = Path(dest)
    tmp = make_temp_dir(dest)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish_dir(tmp, dest)


def publish_dir(tmp: Path, dest: Path) -> None:
    """Swap `tmp` in as `dest`; an old `dest` is renamed aside first, never half-deleted."""
    old = None
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        os.replace(dest, old)
    os.replace(tmp, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
