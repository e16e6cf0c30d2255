"""One writer at a time per database file, across processes.

Every write edits a copy and renames it in (filledfirst.store.ingest.edited_copy): two at
once would each copy the same file and the later rename would drop the other's runs. So
a writer holds `<db>.lock` from copy to rename. fcntl.flock: the kernel releases it when
its process ends, however it ends, so a killed writer never leaves the database locked.
"""

from __future__ import annotations

import fcntl
import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

log = logging.getLogger(__name__)

_HELD: set[Path] = set()  # this process's locks: taking one twice would wait forever


def lock_path(db_path: str | os.PathLike) -> Path:
    db_path = Path(db_path).absolute()
    return db_path.with_name(db_path.name + ".lock")


@contextmanager
def write_lock(db_path: str | os.PathLike) -> Iterator[None]:
    """Hold the database's lock for the block; a second writer waits (saying so once)."""
    path = lock_path(db_path)
    if path in _HELD:
        raise RuntimeError(f"{db_path}: this process holds its lock already")
    path.parent.mkdir(parents=True, exist_ok=True)
    said = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not said:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                log.info("%s: waiting for the lock (%s, held by process %s, writing it)", db_path, path.name, holder)
                said = True
            fcntl.flock(fd, fcntl.LOCK_EX)
        # The writer before removed the file on its way out: a lock on a removed file locks
        # nothing, so take the one at the path now.
        try:
            current = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD.add(path)
    try:
        yield
    finally:
        _HELD.discard(path)
        path.unlink(missing_ok=True)  # while still held: no lock file is left behind
        os.close(fd)
