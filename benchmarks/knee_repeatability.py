"""Knee repeatability: the same setting searched again and again on one server start,
the old holding rule against the new one, side by side in one run.

    make install && HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/knee_repeatability.py --out /tmp/knees

(from the repository root, after `make demo` has built the tiny model; about 15 minutes)

Both rules search the same frontier of the config (default: config/cpu.yaml's `decode`,
setting `capped`) with the same SLO, target and probe lengths from lifetimes, on one vLLM
start, alternating (old, new, old, new, ...) so that a drift of the machine falls on both:

- old: grow from `start` by `growth`, bisect; a probe holds when its share of requests
  meeting the SLO reaches the target (confidence 0, no backlog test, no estimate);
- new: the frontier's own settings: a capacity estimate from a closed loop at the cap,
  bracketing around it, a probe judged by its attainment interval and its backlog, and
  the drift check at the end.

For each rule: the knees (lo), max/min of them, the probes and wall time per search, and
for the new rule whether each search's interval [floor, hi) holds the others' knees.
"""

from __future__ import annotations

import dataclasses
import time

from search_bench import arguments, summary
from search_bench import prober as make_prober

from filledfirst.frontier.search import CapacitySearch
from filledfirst.run.search import CHECK, ESTIMATE, probe_to_the_end


def main() -> None:
    ap = arguments(__doc__.splitlines()[0], "capped")
    ap.add_argument("--repeat", type=int, default=3, help="searches per rule")
    args = ap.parse_args()
    _, new, prober = make_prober(args)
    out = prober.out
    old = dataclasses.replace(new, estimate_batches=None,
                              bounds=dataclasses.replace(new.bounds, confidence=0.0, backlog_max_growth=None))
    concurrency = new.estimate_concurrency(args.setting)
    if concurrency is None:
        prober.close()
        raise SystemExit("the new rule needs max_num_seqs in the setting or engine.server (for its estimate)")
    rows: dict[str, list[dict]] = {"old": [], "new": []}
    try:
        for i in range(1, args.repeat + 1):
            for rule, plan in (("old", old), ("new", new)):
                # One prober, one server: each search writes its own folders.
                prober.plan, prober.out = plan, out / f"{rule}-{i}"
                prober.out.mkdir(exist_ok=True)
                t0 = time.monotonic()
                first = drift = None
                if rule == "new":
                    first = prober.reference(ESTIMATE, concurrency).throughput_rps
                search, records = CapacitySearch(plan.bounds, first=first), []
                probe_to_the_end(prober, search, records)
                if rule == "new":
                    end = prober.reference(CHECK, concurrency).throughput_rps
                    drift = end / first - 1 if first and end else None
                r = search.result()
                rows[rule].append({"lo": r.lo, "hi": r.hi, "floor": r.floor, "probes": len(records),
                                   "wall": time.monotonic() - t0, "reason": r.reason.value, "drift": drift,
                                   "estimate": first})
                print(f"{rule} {i}: {rows[rule][-1]}", flush=True)
    finally:
        prober.close()
    print(f"\n{args.frontier}/{args.setting}, {args.repeat} searches per rule, alternating on one server start\n")
    print("| rule | knees (req/s) | max/min | probes per search | wall per search | intervals hold the others' knees |")
    print("|---|---|---:|---:|---:|---|")
    for rule, rs in rows.items():
        knees, spread, probes, wall = summary(rs)
        holds = "-"
        if rule == "new" and len(knees) == len(rs):
            ok = sum(r["floor"] <= o["lo"] < r["hi"] for r in rs for o in rs if o is not r and r["hi"])
            holds = f"{ok} of {len(rs) * (len(rs) - 1)}"
        print(f"| {rule} | {', '.join(f'{k:.3g}' for k in knees)} | {spread} | {probes:.1f} | {wall:.0f} s | {holds} |")
    drifts = [r["drift"] for r in rows["new"] if r["drift"] is not None]
    if drifts:
        print(f"\nDrift over each new-rule search (closed loop at the cap, end against start): "
              f"{', '.join(f'{d:+.1%}' for d in drifts)}")


if __name__ == "__main__":
    main()
