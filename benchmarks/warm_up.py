"""Server speed over its first minutes: the capacity estimate's closed loop run again and
again, back to back, on one server start, for each setting named; the throughput of each
loop against the first. Tells a server that warms up (a rise over the first loops, then a
plateau) from a machine whose speed wanders (no order in the changes).

    make install && HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/warm_up.py --out /tmp/warm \
        --frontier kv --setting reduced --loops 6

(from the repository root, after `make demo` has built the tiny model; a few minutes)
"""

from __future__ import annotations

import time

from search_bench import arguments
from search_bench import prober as make_prober


def main() -> None:
    ap = arguments(__doc__.splitlines()[0], "capped")
    ap.add_argument("--loops", type=int, default=6, help="closed loops, back to back")
    args = ap.parse_args()
    _, plan, prober = make_prober(args)
    concurrency = plan.estimate_concurrency(args.setting)
    if concurrency is None:
        prober.close()
        raise SystemExit("the setting needs max_num_seqs (the loop fills it)")
    rows = []
    try:
        start = time.monotonic()
        for i in range(1, args.loops + 1):
            ref = prober.reference(f"loop{i:02d}", concurrency)
            rows.append((i, time.monotonic() - start, ref.throughput_rps))
    finally:
        prober.close()
    first = rows[0][2]
    print(f"{args.frontier}/{args.setting}: {args.loops} closed loops of {concurrency}, "
          f"{plan.reference_requests(concurrency)} requests each")
    print("| loop | ended at (s since the first began) | req/s | against the first |")
    print("|---:|---:|---:|---:|")
    for i, t, rps in rows:
        print(f"| {i} | {t:.0f} | {rps:.3g} | {rps / first - 1:+.0%} |")


if __name__ == "__main__":
    main()
