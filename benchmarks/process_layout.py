"""A vLLM CPU server's start and speed in two process layouts, side by side: vLLM's own
(the API server, an engine core it spawns, and a worker the engine core spawns, each
importing vLLM afresh) and the worker inside the engine core
(VLLM_ENABLE_V1_MULTIPROCESSING=0 with the single-process executor, one OpenMP thread as
the worker gets in vLLM's layout). Each block is a server start of one layout and one
closed loop of the setting's paired block on it; the blocks go A B B A in each round, so
the machine's wander falls on both layouts. Tells whether a start can lose one vLLM
import without changing the speed the study measures.

    make install && HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/process_layout.py --out /tmp/layout \
        --frontier decode --setting capped --rounds 2

(from the repository root, after `make demo` has built the tiny model; two rounds took 5 minutes here)
"""

from __future__ import annotations

import copy
import statistics
from contextlib import closing
from typing import NamedTuple

import psutil
from search_bench import arguments

from filledfirst.config import load_config, search_fingerprint
from filledfirst.frontier.plan import paired_requests, search_plan
from filledfirst.interrupts import install_interrupt_handlers, watch_owners
from filledfirst.run.search import Prober
from filledfirst.study import Study, as_study

VLLM = "vLLM's"
ONE_PROCESS = "engine core"
LAYOUTS = (VLLM, ONE_PROCESS)
ORDER = (VLLM, ONE_PROCESS, ONE_PROCESS, VLLM)


class Block(NamedTuple):
    round: int
    block: int
    layout: str
    processes: int  # the server's process tree
    start_s: float
    rps: float | None


def layout_config(cfg: dict, layout: str) -> dict:
    """The study's config with the server started in `layout`."""
    cfg = copy.deepcopy(cfg)
    if layout == ONE_PROCESS:
        engine = cfg.setdefault("engine", {})
        engine["env"] = {**engine.get("env", {}), "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}
        server = engine.setdefault("server", {})
        server["extra_args"] = [*(server.get("extra_args") or []), "--distributed-executor-backend", "uni"]
    return cfg


def main() -> None:
    ap = arguments(__doc__.splitlines()[0], "capped")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of A B B A blocks")
    args = ap.parse_args()
    install_interrupt_handlers()  # Ctrl-C or a kill still stops the server (no orphan vLLM)
    watch_owners()
    base = load_config([args.config])
    configs = {layout: layout_config(base, layout) for layout in LAYOUTS}
    studies = {layout: Study.from_dict(cfg) for layout, cfg in configs.items()}
    plans = {layout: search_plan(study, args.frontier, args.setting) for layout, study in studies.items()}
    prints = {layout: search_fingerprint(as_study(cfg), args.frontier, args.setting) for layout, cfg in configs.items()}
    n = plans[VLLM].holds(args.setting)
    if n is None:
        raise SystemExit("the setting needs max_num_seqs (the loop fills it)")
    out = args.out.resolve()
    rows = []
    for r in range(1, args.rounds + 1):
        for i, layout in enumerate(ORDER, 1):
            folder = out / f"r{r}b{i}"
            folder.mkdir(parents=True, exist_ok=True)
            with closing(Prober(studies[layout], plans[layout], args.setting, folder, prints[layout], None, None,
                                progress=False)) as prober:
                loop = prober.reference("loop", n, requests=paired_requests(n))
                server = prober.shared.server
                processes = 1 + len(psutil.Process(server.proc.pid).children(recursive=True))
                rows.append(Block(r, i, layout, processes, prober.shared.startup_s, loop.throughput_rps))
    print(f"{args.frontier}/{args.setting}: a closed loop of {n} ({paired_requests(n)} requests) on each start")
    print("| round | block | layout | processes | start (s) | req/s |")
    print("|---:|---:|---|---:|---:|---:|")
    for b in rows:
        rate = f"{b.rps:.3g}" if b.rps else "failed"
        print(f"| {b.round} | {b.block} | {b.layout} | {b.processes} | {b.start_s:.1f} | {rate} |")
    for layout in LAYOUTS:
        starts = [b.start_s for b in rows if b.layout == layout]
        print(f"{layout}: start median {statistics.median(starts):.1f} s "
              f"(min {min(starts):.1f}, max {max(starts):.1f})")
    # each round's two pairs (blocks 1-2 and 3-4): the single process's rate over vLLM's
    pairs = [(a, b) if a.layout == VLLM else (b, a) for a, b in zip(rows[::2], rows[1::2])]
    ratios = [one.rps / two.rps for two, one in pairs if one.rps and two.rps]
    print("engine core's rate over vLLM's, pair by pair: " + ", ".join(f"{x:.2f}" for x in ratios))


if __name__ == "__main__":
    main()
