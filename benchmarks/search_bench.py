"""What the capacity-search benchmarks share: their command line (config, frontier,
setting, work folder) and one Prober on one server start for the frontier's setting."""

from __future__ import annotations

import argparse
from pathlib import Path

from filledfirst.config import load_config, search_fingerprint
from filledfirst.frontier.plan import FrontierPlan, search_plan
from filledfirst.interrupts import install_interrupt_handlers, watch_owners
from filledfirst.run.search import Prober
from filledfirst.study import Study, SyntheticWorkload, as_study

REPO = Path(__file__).resolve().parent.parent


def arguments(description: str, setting: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--config", type=Path, default=REPO / "config" / "cpu.yaml")
    ap.add_argument("--frontier", default="decode")
    ap.add_argument("--setting", default=setting)
    ap.add_argument("--out", type=Path, required=True, help="work folder (never inside the repository)")
    return ap


def summary(rows: list[dict]) -> tuple[list[float], str, float, float]:
    """Searches' rows ({lo, probes, wall, ...}): their knees, max/min of them ("-" unless
    every search held a rate), and the mean probes and wall seconds a search."""
    knees = [r["lo"] for r in rows if r["lo"]]
    spread = f"{max(knees) / min(knees):.3f}" if len(knees) == len(rows) and knees else "-"
    return knees, spread, sum(r["probes"] for r in rows) / len(rows), sum(r["wall"] for r in rows) / len(rows)


def prober(args: argparse.Namespace) -> tuple[Study, FrontierPlan, Prober]:
    """The study, the search's plan and a Prober writing into args.out (close it at the end)."""
    cfg = load_config([args.config])
    study = Study.from_dict(cfg)
    plan = search_plan(study, args.frontier, args.setting)
    if not isinstance(plan.workload, SyntheticWorkload):
        raise SystemExit("the benchmark probes synthetic shapes only")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    install_interrupt_handlers()  # Ctrl-C or a kill still stops the server (no orphan vLLM)
    watch_owners()
    fp = search_fingerprint(as_study(cfg), args.frontier, args.setting)
    return study, plan, Prober(study, plan, args.setting, out, fp, None, None, progress=False)
