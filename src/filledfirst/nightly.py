"""The nightly job (`filledfirst nightly`): the study measured into a fresh dated folder,
compared with the last good night, both pages published, the baseline moved only on a
pass.

Under the root folder:

    nights/<UTC time>/    a night: Snakemake's working folder (results/, reports/), with
                          `data` linked to the checkout's (the model and traces, fetched once)
                          and nightly.yaml, the overlay naming its baseline
    last-good             a link to the last night that passed the gate

Every night is measured from nothing (a fresh folder holds no results, so Snakemake
re-runs every job), so two nights are two measurements, never a database compared with
itself. The first night has no baseline: it becomes one when its study completes. A
night whose study fails is kept for its logs; the baseline stays. Old nights beyond
`keep` are removed, never the baseline.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml

from filledfirst import atomic
from filledfirst.errors import UserError
from filledfirst.interrupts import set_parent_death_signal
from filledfirst.paths import results_database
from filledfirst.study import Study

log = logging.getLogger(__name__)

NIGHTS = "nights"
LAST_GOOD = "last-good"
OVERLAY = "nightly.yaml"
PAGES = ("report.html", "compare.html")
PASSED, GATE_FAILED, STUDY_FAILED = 0, 1, 2
STOP_GRACE_S = 120.0  # Snakemake stops its jobs (and their servers) on SIGINT; then it is killed


@dataclass(frozen=True)
class Night:
    folder: Path

    @property
    def results(self) -> Path:
        return self.folder / "results"

    @property
    def reports(self) -> Path:
        return self.folder / "reports"


Measure = Callable[[Night, list[Path]], int]  # the night and its config files -> exit status


def snakemake(snakefile: Path, cores: int, extra: Sequence[str]) -> Measure:
    """The study's `all` through Snakemake in the night's folder, stopped with us."""
    def measure(night: Night, configs: list[Path]) -> int:
        argv = [sys.executable, "-m", "snakemake", "--snakefile", str(snakefile), "--directory", str(night.folder),
                "--cores", str(cores), "all", "--configfile", *map(str, configs), *extra]
        log.info("night %s: %s", night.folder.name, " ".join(argv))
        proc = subprocess.Popen(argv, preexec_fn=set_parent_death_signal)
        try:
            return proc.wait()
        except BaseException:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
    return measure


def run(configs: list[Path], root: Path, measure: Measure, *, data: Path | None = None, publish: Path | None = None,
        keep: int = 14, now: datetime | None = None) -> int:
    """One night: PASSED (or the first night, now the baseline), GATE_FAILED or STUDY_FAILED."""
    from filledfirst.config import load_study

    configs = [c.resolve() for c in configs]
    study = load_study(configs)  # a config error stops the night before anything runs
    root = root.resolve()
    baseline = _baseline(root)
    night = _new_night(root, now or datetime.now(timezone.utc))
    if data is not None and data.is_dir():
        (night.folder / "data").symlink_to(data.resolve(), target_is_directory=True)
    overlay = [] if baseline is None else [night.folder / OVERLAY]
    if baseline is not None:
        # the workflow compares too, so the night's report links its comparison
        overlay[0].write_text(yaml.safe_dump({"compare": {"baseline": str(baseline.results)}}))
    status = _night(study, night, baseline, measure(night, configs + overlay), publish)
    _prune(root, keep)
    return status


def _night(study: Study, night: Night, baseline: Night | None, exit_status: int, publish: Path | None) -> int:
    """What a measured night comes to: compared, published, and the new baseline on a pass."""
    from filledfirst.compare import compare, gate, page, store

    if exit_status != 0 or not results_database(night.results).is_file():
        log.error("night %s: the study failed (exit %s); the baseline stays %s", night.folder.name, exit_status,
                  baseline.folder.name if baseline else "unset")
        return STUDY_FAILED
    reasons: list[str] = []
    if baseline is not None:
        comparison = compare(baseline.results, night.results, study.compare, study.report.publish)
        reasons = gate.reasons(comparison, study.compare.fail_on)
        store.write(comparison, night.results / "compare.duckdb")
        atomic.write_text(page.page_html(comparison, reasons, None), night.reports / "compare.html")
        for line in reasons:
            print(f"gate: {line}", file=sys.stderr)
    if publish is not None:
        _publish(night, publish)
    if reasons:
        log.error("night %s: the gate failed against %s (%d reasons); the baseline stays", night.folder.name,
                  baseline.folder.name if baseline else "", len(reasons))
        return GATE_FAILED
    _point(night.folder.parent.parent / LAST_GOOD, night.folder)
    log.info("night %s: %s; it is the baseline now", night.folder.name,
             f"passed the gate against {baseline.folder.name}" if baseline else "the first night")
    return PASSED


def _baseline(root: Path) -> Night | None:
    link = root / LAST_GOOD
    if not link.exists():
        return None
    night = Night(link.resolve())
    if not results_database(night.results).is_file():
        raise UserError(f"{link} points at {night.folder}, which has no results database: point it at a night "
                        "that has one, or remove it to start from a first night")
    return night


def _new_night(root: Path, now: datetime) -> Night:
    stamp = now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H%M%SZ")
    nights = root / NIGHTS
    nights.mkdir(parents=True, exist_ok=True)
    for n in range(100):
        folder = nights / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            folder.mkdir()
            return Night(folder)
        except FileExistsError:
            continue
    raise UserError(f"{nights}: a hundred nights started at {stamp}")


def _publish(night: Night, to: Path) -> None:
    for name in PAGES:
        page = night.reports / name
        if page.is_file():
            with atomic.atomic_path(to / name, ".html") as tmp:
                shutil.copyfile(page, tmp)
    log.info("night %s: published %s", night.folder.name,
             ", ".join(str(to / n) for n in PAGES if (night.reports / n).is_file()))


def _point(link: Path, target: Path) -> None:
    """Make `link` a symlink to `target` in one step (a new link renamed over the old)."""
    tmp = link.with_name(f".{link.name}.new")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target, target_is_directory=True)
    os.replace(tmp, link)


def _prune(root: Path, keep: int) -> None:
    """Remove the oldest nights beyond `keep`, never the baseline."""
    good = (root / LAST_GOOD).resolve()
    nights = sorted((p for p in (root / NIGHTS).iterdir() if p.is_dir()), key=lambda p: p.name)
    for old in nights[:-keep] if keep > 0 else []:
        if old.resolve() != good:
            shutil.rmtree(old)
            log.info("removed night %s (keeping %d)", old.name, keep)
