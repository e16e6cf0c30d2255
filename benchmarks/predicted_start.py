"""An intervention's search from its parent's knee against the same search from its
predicted knee, side by side in one run on one server start.

    make demo   # (or its decode searches) for the parent's search.json and the prediction
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/predicted_start.py --out /tmp/starts

(from the repository root; about 15 minutes with the defaults)

The intervention (default: config/cpu.yaml's `decode/capped_seqs_x2`) is searched
`--repeat` times from each start, alternating (parent's knee, predicted, parent's knee,
...) so that a drift of the machine falls on both, each judged against the parent's knee
and stopped once its move is decided, as in the study. The parent's search.json and the
intervention's prediction.json are read from the study's results (`--results`), as the
intervention's job reads them.

For each start: the knees (lo), max/min of them, the probes and wall time per search,
and the move each search's knee makes from the parent's (up / no / down) with its least
shift: the verdict a search gives.
"""

from __future__ import annotations

import time
from pathlib import Path

from search_bench import REPO, arguments, summary
from search_bench import prober as make_prober

from filledfirst.contracts.search import SEARCH_JSON, SearchRecord
from filledfirst.frontier.interventions import Span, move
from filledfirst.frontier.search import CapacitySearch
from filledfirst.run.search import parent_knee, probe_to_the_end


def main() -> None:
    ap = arguments(__doc__.splitlines()[0], "capped_seqs_x2")
    ap.add_argument("--results", type=Path, default=REPO / "results" / "frontiers",
                    help="the study's search folders (the parent's search.json, the intervention's prediction.json)")
    ap.add_argument("--repeat", type=int, default=3, help="searches per start")
    args = ap.parse_args()
    _, plan, prober = make_prober(args)
    relaxed = plan.interventions.get(args.setting)
    if relaxed is None:
        prober.close()
        raise SystemExit(f"{args.frontier}/{args.setting} is not an intervention")
    # as the intervention's job starts: its parent's search.json and its prediction.json
    start = parent_knee(args.results / args.frontier / args.setting, relaxed)
    parent = SearchRecord.read(args.results / args.frontier / relaxed.parent / SEARCH_JSON)
    predicted = start.predicted
    if predicted is None or start.against is None:
        prober.close()
        raise SystemExit("no predicted start from the parent's search beside it (see the prediction's why): "
                         "nothing to compare")
    against, least = start.against, start.least_shift
    starts = {"parent's knee": parent.result.lo, "predicted": start.first}
    folders = {"parent's knee": "from-parent", "predicted": "from-predicted"}
    print(f"{args.frontier}/{args.setting}: parent {relaxed.parent} knee {parent.result.lo:.4g} req/s, "
          f"predicted shift {predicted.shift:+.1%} ({predicted.why})", flush=True)
    out = prober.out
    rows: dict[str, list[dict]] = {name: [] for name in starts}
    try:
        for i in range(1, args.repeat + 1):
            for name, first in starts.items():
                prober.out = out / f"{folders[name]}-{i}"
                prober.out.mkdir(exist_ok=True)
                t0 = time.monotonic()
                search = CapacitySearch(plan.bounds, first=first, against=against, min_shift=least)
                records: list = []
                probe_to_the_end(prober, search, records)
                r = search.result()
                moved = move(against, Span.of(r.lo, r.hi, r.floor), least) if r.lo or r.hi else None
                rows[name].append({"lo": r.lo, "hi": r.hi, "probes": len(records), "wall": time.monotonic() - t0,
                                   "reason": r.reason.value, "move": moved.value if moved else None})
                print(f"{name} {i}: {rows[name][-1]}", flush=True)
    finally:
        prober.close()
    print(f"\n{args.frontier}/{args.setting} against {relaxed.parent}'s knee {parent.result.lo:.4g} req/s "
          f"(least shift {least:.0%}), {args.repeat} searches per start, alternating on one server start\n")
    print("| start | first rate (req/s) | knees (req/s) | max/min | moves | probes per search | wall per search |")
    print("|---|---:|---|---:|---|---:|---:|")
    for name, rs in rows.items():
        knees, spread, probes, wall = summary(rs)
        print(f"| {name} | {starts[name]:.3g} | {', '.join(f'{k:.3g}' for k in knees)} | {spread} | "
              f"{', '.join(str(r['move']) for r in rs)} | {probes:.1f} | {wall:.0f} s |")


if __name__ == "__main__":
    main()
