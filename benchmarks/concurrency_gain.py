"""What relaxing a limit can buy, without a search's noise: the closed loop of a frontier's
shape at several concurrencies, in rounds, on one server start with room for all of them,
so each concurrency's throughput is measured next to the others again and again. The
throughput at 2n against n bounds what doubling a limit that admits n requests at once
(a sequence cap, a KV budget) can move that setting's knee. With `--reference FRONTIER:C`,
each round also runs that frontier's shape at concurrency C on the same server: a speed
reference, to see whether the machine's wander shows in it the same way (if it did, knees
could be divided by it).

    make install && HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/concurrency_gain.py --out /tmp/gain \\
        --frontier kv --concurrency 7,14,29 --rounds 5 --reference decode:4

(from the repository root, after `make demo` has built the tiny model; about 15 minutes)
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from filledfirst.config import deep_merge, load_config, search_fingerprint, validate_config
from filledfirst.frontier.plan import search_plan
from filledfirst.interrupts import install_interrupt_handlers, watch_owners
from filledfirst.run.search import Prober
from filledfirst.study import Study, as_study

REPO = Path(__file__).resolve().parent.parent
SETTING = "gain"  # the setting this adds to the frontiers it probes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=REPO / "config" / "cpu.yaml")
    ap.add_argument("--frontier", default="kv")
    ap.add_argument("--concurrency", default="7,14,29", help="comma-separated closed-loop concurrencies")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kv-blocks", type=int, default=640, help="the server's KV blocks (room for every loop)")
    ap.add_argument("--reference", help="FRONTIER:CONCURRENCY, a speed reference run before each round's loops")
    ap.add_argument("--out", type=Path, required=True, help="work folder (never inside the repository)")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    server = {"num_gpu_blocks_override": args.kv_blocks, "max_num_seqs": max(levels + [64])}
    ref_frontier, ref_c = (args.reference.split(":") if args.reference else (None, None))
    frontiers = [args.frontier] + ([ref_frontier] if ref_frontier else [])
    cfg = load_config([args.config])
    cfg = deep_merge(cfg, {"frontiers": {f: {"settings": {SETTING: server}} for f in frontiers}})
    validate_config(cfg)
    study = Study.from_dict(cfg)
    out = args.out.resolve()
    install_interrupt_handlers()  # Ctrl-C or a kill still stops the server (no orphan vLLM)
    watch_owners()
    probers = {}
    for f in frontiers:
        (out / f).mkdir(parents=True, exist_ok=True)
        fp = search_fingerprint(as_study(cfg), f, SETTING)
        probers[f] = Prober(study, search_plan(study, f, SETTING), SETTING, out / f, fp, None, None, progress=False,
                            before=next(iter(probers.values()), None))
    rows: list[dict[str, float]] = []
    try:
        for r in range(args.rounds):
            row = {}
            if ref_frontier:
                row["reference"] = probers[ref_frontier].reference(f"r{r}ref", int(ref_c)).throughput_rps
            for c in levels:
                row[str(c)] = probers[args.frontier].reference(f"r{r}c{c}", c).throughput_rps
            rows.append(row)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v:.3g}" for k, v in row.items()), flush=True)
    finally:
        probers[args.frontier].close()
    cols = list(rows[0])
    print(f"\n{args.frontier}, closed loops (req/s) on {args.kv_blocks} KV blocks"
          + (f"; reference: {ref_frontier} at {ref_c}" if ref_frontier else ""))
    print("| round | " + " | ".join(cols) + " |")
    print("|---:|" + "---:|" * len(cols))
    for i, row in enumerate(rows, 1):
        print(f"| {i} | " + " | ".join(f"{row[c]:.3g}" for c in cols) + " |")
    for a, b in zip(levels, levels[1:]):
        gains = [row[str(b)] / row[str(a)] for row in rows]
        print(f"{b} against {a}: median x{statistics.median(gains):.2f} (x{min(gains):.2f}-x{max(gains):.2f})")
    if ref_frontier:
        for c in levels:
            raw = [row[str(c)] for row in rows]
            norm = [row[str(c)] / row["reference"] for row in rows]
            spread = [statistics.pstdev(v) / statistics.mean(v) for v in (raw, norm)]
            print(f"{c}: spread over rounds {spread[0]:.0%} raw, {spread[1]:.0%} divided by the reference")


if __name__ == "__main__":
    main()
