"""Capacity search against a fixed linear sweep: probes and wall time to the same
precision, on one server, in one run.

    make install && HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/search_vs_sweep.py --out /tmp/svs

(from the repository root, after `make demo` has built the tiny model; about 5 minutes)

Both probe the same frontier of the config (default: config/cpu.yaml's `decode`,
setting `default`) with the same probe schedules, SLO and attainment target, on one
vLLM start (the search's own `Prober`). First the capacity search runs to its end
(grow geometrically, then bisect). Then the linear sweep: rates d, 2d, 3d, ... up to the
first rate that breaks, with d = (precision - 1) x the knee the search found, so that at
the knee its bracket is as tight as the search's. That step needs the knee in advance,
which a real linear sweep does not have: this is the sweep at its best. Without it, a
sweep that must reach `precision` at any knee down to `start` steps by (precision - 1) x
start; its probe count to the same knee is printed as arithmetic, not measured.
"""

from __future__ import annotations

import math
import time

from search_bench import arguments
from search_bench import prober as make_prober

from filledfirst.frontier.search import CapacitySearch
from filledfirst.run.search import probe_outcome


def main() -> None:
    ap = arguments(__doc__.splitlines()[0], "default")
    ap.add_argument("--max-sweep", type=int, default=40, help="stop the linear sweep after this many probes")
    args = ap.parse_args()
    _, plan, prober = make_prober(args)
    rows = []
    try:
        search = CapacitySearch(plan.bounds)
        t0 = time.monotonic()
        while (rate := search.next_rate()) is not None:
            meta = prober.measure(len(rows) + 1, rate)
            search.record(probe_outcome(meta))
            rows.append(("search", rate, meta.frontier.attainment))
        search_wall = time.monotonic() - t0
        result = search.result()
        n_search = len(rows)
        if result.lo is None or result.hi is None:
            raise SystemExit(f"the search found no bracket ({result.reason}): nothing to compare")
        step = (plan.bounds.precision - 1) * result.lo
        t0 = time.monotonic()
        k, lin_lo, lin_hi = 1, None, None
        while k <= args.max_sweep:
            rate = k * step
            meta = prober.measure(len(rows) + 1, rate)
            held = bool(meta.frontier.held)
            rows.append(("sweep", rate, meta.frontier.attainment))
            if not held:
                lin_hi = rate
                break
            lin_lo = rate
            k += 1
        sweep_wall = time.monotonic() - t0
    finally:
        prober.close()
    n_sweep = sum(1 for r in rows if r[0] == "sweep")
    blind = math.ceil((result.hi - plan.bounds.start) / ((plan.bounds.precision - 1) * plan.bounds.start)) + 1
    print("| probe | method | rate (req/s) | attainment |\n|---:|---|---:|---:|")
    for i, (method, rate, att) in enumerate(rows, 1):
        print(f"| {i} | {method} | {rate:.3g} | {att if att is None else f'{att:.3f}'} |")
    print()
    print("| method | probes | wall time | bracket (req/s) | hi/lo |\n|---|---:|---:|---|---:|")
    print(f"| capacity search | {n_search} | {search_wall:.0f} s | [{result.lo:.3g}, {result.hi:.3g}) | "
          f"{result.hi / result.lo:.3f} |")
    lin = f"[{lin_lo:.3g}, {lin_hi:.3g})" if lin_lo and lin_hi else f"[{lin_lo}, {lin_hi})"
    ratio = f"{lin_hi / lin_lo:.3f}" if lin_lo and lin_hi else "-"
    print(f"| linear sweep, step {step:.3g} req/s (knowing the knee) | {n_sweep} | {sweep_wall:.0f} s | {lin} | "
          f"{ratio} |")
    print(f"\nA linear sweep that must reach hi/lo <= {plan.bounds.precision:g} at any knee from the start rate "
          f"({plan.bounds.start:g} req/s) steps by {(plan.bounds.precision - 1) * plan.bounds.start:.3g} req/s: "
          f"{blind} probes to reach {result.hi:.3g} req/s (arithmetic, not measured).")


if __name__ == "__main__":
    main()
