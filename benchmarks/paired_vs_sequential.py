"""An intervention's verdict from two searches one after the other against its paired check's.

Both on the same servers in one run, alternating.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/paired_vs_sequential.py --out /tmp/paired

(from the repository root; about 11 minutes a round, 25 with the defaults)

The intervention (default: config/cpu.yaml's `decode/capped_seqs_x2`) is judged
`--repeat` times each way, the order alternating between rounds (sequential first in odd
rounds) so that a drift of the machine falls on both:

- sequential: its parent's search (from its capacity estimate, with the drift check after
  it), then its own from the parent's knee; the verdict is the move of its knee from the
  parent's (up / no / down) beyond the least shift widened by the parent's drift, as
  table `frontiers` judges it.
- paired: the paired check (blocks B A A B of closed loops at the larger cap); the verdict
  confirmed / not confirmed / inconclusive from the pairs' shifts and whether the relaxed
  resource was used beyond the parent's limit (filledfirst.frontier.paired).

Both run as a searched intervention's job runs them (filledfirst.run.search: the paired
check B A A B after the intervention's search; the shipped study, judging its interventions
alone, runs A B B A in the parent's job), each round in its own
folder (`round<i>/<parent>`, `round<i>/<setting>`, `round<i>/paired`) so nothing is read
back from another round. One server runs at a time. Wall times include the server starts
each method needs: two for the searches, and for the paired check the parent's and the
intervention's again, its first block on the intervention's server still running from
before, as after its search in the study.
"""

from __future__ import annotations

import time
from contextlib import closing
from pathlib import Path

from search_bench import arguments
from search_bench import prober as make_prober

from filledfirst.analysis.frontiers import paired_why
from filledfirst.config import search_fingerprint
from filledfirst.contracts.search import Intervention
from filledfirst.frontier import paired
from filledfirst.frontier.interventions import Span, lo_ratio, move
from filledfirst.frontier.plan import search_plan
from filledfirst.run.paired import run_paired
from filledfirst.run.search import Prober, paired_parent, parent_knee, search_to_the_end
from filledfirst.study import Study


def sequential(study: Study, prober: Prober, relaxed: Intervention, out: Path) -> dict:
    """The parent's search and then the intervention's, in sibling folders of `out` as
    the study lays them out (parent_knee reads the parent's search.json beside them)."""
    frontier = prober.plan.name
    (out / relaxed.parent).mkdir(parents=True)
    prober.shared.stop()  # one engine at a time: the intervention's may still run from a paired check
    parent = Prober(study, search_plan(study, frontier, relaxed.parent), relaxed.parent, out / relaxed.parent,
                    search_fingerprint(study, frontier, relaxed.parent), None, None, progress=False)
    try:
        before = search_to_the_end(parent)
    finally:
        parent.close()
    prober.out = out / prober.setting
    prober.out.mkdir()
    after = search_to_the_end(prober)
    least = parent_knee(prober.out, relaxed).least_shift  # min_shift widened by the parent's drift
    a, b = Span.of_result(before.result), Span.of_result(after.result)
    ratio = lo_ratio(before.result.lo, after.result.lo)
    knees = " -> ".join("none" if r.lo is None else f"{r.lo:.3g}" for r in (before.result, after.result))
    return {"verdict": str(move(a, b, least)) if a and b else "no knee", "shift": None if ratio is None else ratio - 1,
            "why": f"knee {knees} req/s, least shift {least:.0%}"}


def paired_check(study: Study, prober: Prober, relaxed: Intervention, n: int, out: Path) -> dict:
    """The paired check as the searched intervention's job wires it (run.search.run_searches)."""
    prober.out = out
    out.mkdir(parents=True)
    with closing(paired_parent(study, prober, relaxed)) as parent:
        check = run_paired(prober, parent, relaxed, n, paired.AFTER_RELAXED)
    found = paired.verdict(paired.blocks_of(check), relaxed.min_shift)  # unwidened, as table `frontiers`
    return {"verdict": str(found.verdict), "shift": found.shift, "lo": found.shift_lo, "hi": found.shift_hi,
            "why": paired_why(found, relaxed.knob.value)}


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.0%}"


def main() -> None:
    ap = arguments(__doc__.splitlines()[0], "capped_seqs_x2")
    ap.add_argument("--repeat", type=int, default=2, help="rounds, each judging the intervention both ways")
    args = ap.parse_args()
    study, plan, prober = make_prober(args)
    relaxed = plan.interventions.get(args.setting)
    n = plan.paired_concurrency(args.setting) if relaxed is not None else None
    top = prober.out
    # a round's folders measured afresh: search_to_the_end and run_paired would read back what they find there
    why = (f"{args.frontier}/{args.setting} is not an intervention" if relaxed is None
           else f"neither {args.setting} nor {relaxed.parent} states max_num_seqs: no paired check" if n is None
           else f"{top}: rounds of an earlier run there; give an empty --out" if any(top.glob("round*")) else None)
    if why:
        prober.close()
        raise SystemExit(why)
    assert relaxed is not None and n is not None
    methods = {"sequential": lambda d: sequential(study, prober, relaxed, d),
               "paired": lambda d: paired_check(study, prober, relaxed, n, d / "paired")}
    rows: dict[str, list[dict]] = {name: [] for name in methods}
    try:
        for i in range(1, args.repeat + 1):
            for name in (list(methods) if i % 2 else list(methods)[::-1]):
                t0 = time.monotonic()
                row = methods[name](top / f"round{i}")
                row["minutes"] = (time.monotonic() - t0) / 60
                rows[name].append(row)
                print(f"round {i} {name}: {row['verdict']}, shift {pct(row['shift'])} in {row['minutes']:.1f} min "
                      f"({row['why']})", flush=True)
    finally:
        prober.close()
    print(f"\n{args.frontier}/{args.setting} against {relaxed.parent}: {args.repeat} rounds, "
          f"paired in closed loops of {n}\n")
    print("| method | verdicts over rounds | shifts | engine-minutes per verdict |")
    print("|---|---|---|---:|")
    for name, rs in rows.items():
        shifts = [pct(r["shift"]) + (f" [{pct(r['lo'])}, {pct(r['hi'])}]" if name == "paired" else "") for r in rs]
        minutes = sum(r["minutes"] for r in rs) / len(rs) if rs else float("nan")
        print(f"| {name} | {', '.join(r['verdict'] for r in rs)} | {', '.join(shifts)} | {minutes:.1f} |")


if __name__ == "__main__":
    main()
