"""Finished run folders kept aside while the rest of their server group runs.

A group's experiments are one Snakemake job. When that job is interrupted, Snakemake
deletes all of its outputs, the finished experiments' folders included, and re-running
would measure them again. So each folder that finishes `ok` is also hard-linked (no
copy: run folders are never modified once published) under `.finished/` beside the run
folders; the re-run restores it instead of measuring again, provided the experiment's
spec and schedule are unchanged and it was measured with the same software on the same
machine (an upgrade or another node between the attempts would mix two setups in one
group). A job that finishes removes its kept copies: from then on its outputs are
Snakemake's.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path

from filledfirst import atomic
from filledfirst.contracts import runmeta
from filledfirst.contracts.runmeta import RunMeta
from filledfirst.run import folder, provenance

log = logging.getLogger(__name__)

KEPT_DIR = ".finished"
# What must be the same for a kept run to stand beside runs measured now. Not the batch
# job (each attempt is another job) nor filledfirst's own version (the spec fingerprint
# covers what it measures).
_SAME_VERSIONS = ("python", "vllm_package", "torch")
_SAME_HARDWARE = ("host", "cpu", "cores", "memory_gib", "gpus")


def kept_path(out: Path) -> Path:
    return out.parent / KEPT_DIR / out.name


def keep(out: Path) -> None:
    """Hard-link the published folder `out` under .finished/, replacing an older copy.
    Best effort: the run folder is published already, and a copy that could not be made
    costs at most a re-measurement after an interruption."""
    _publish_links(out, kept_path(out), "could not keep a copy for a re-run after an interruption")


def restore(out: Path, spec_fingerprint: str, schedule: Path) -> RunMeta | None:
    """Publish the kept folder as `out` if it was measured with this spec and schedule;
    returns its run.json, or None when there is nothing to reuse."""
    src = kept_path(out)
    try:
        meta = runmeta.decode(folder.read_run_json(src))
    except (folder.IncompleteRunDir, ValueError):
        return None
    if meta.status != "ok" or meta.spec_fingerprint != spec_fingerprint:
        return None
    if _digest(src / folder.SCHEDULE) != _digest(schedule):
        return None
    if (why := _other_setup(meta)) is not None:
        log.info("%s: not reusing the run measured before the interruption: %s", out.name, why)
        return None
    if not _publish_links(src, out, "could not restore the finished run, measuring it again"):
        return None
    log.info("%s: reusing the run measured before the job was interrupted (%s)", out.name, meta.run_id)
    return meta


def _other_setup(meta: RunMeta) -> str | None:
    """What differs between the kept run's setup and this machine's now, or None."""
    now = {"versions": provenance.versions(), "hardware": provenance.hardware()}
    for section, keys in (("versions", _SAME_VERSIONS), ("hardware", _SAME_HARDWARE)):
        kept = getattr(meta, section)
        for key in keys:
            if kept.get(key) != now[section].get(key):
                return f"{section}.{key} was {kept.get(key)!r}, is {now[section].get(key)!r}"
    return None


def _publish_links(src: Path, dest: Path, failure: str) -> bool:
    """`src`'s files hard-linked into a temp folder swapped in as `dest`; on an OSError a
    warning (`failure`, why) and nothing published."""
    tmp = None
    try:
        tmp = atomic.make_temp_dir(dest)
        _link_files(src, tmp)
        atomic.publish_dir(tmp, dest)
        return True
    except OSError as exc:
        log.warning("%s: %s (%s)", dest.name, failure, exc)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        return False


def forget(outs: list[Path]) -> None:
    for out in outs:
        shutil.rmtree(kept_path(out), ignore_errors=True)
        for tmp in kept_path(out).parent.glob(f".{out.name}.partial-*"):  # a keep() cut short
            shutil.rmtree(tmp, ignore_errors=True)
    for parent in {kept_path(out).parent for out in outs}:
        try:
            parent.rmdir()  # only if empty: other groups may still keep theirs
        except OSError:
            pass


def _link_files(src: Path, dest: Path) -> None:
    for f in src.iterdir():
        if f.is_dir():
            shutil.copytree(f, dest / f.name)
            continue
        try:
            os.link(f, dest / f.name)
        except OSError:  # another file system, or no hard links there
            shutil.copy2(f, dest / f.name)


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None
