"""Capacity searches for the tests: a search record ended with a given bracket, and the
synthetic probe runs of a frontier `cap` (two settings) with seq8's search, written into a
database by `synthetic_db.make_db`."""

from __future__ import annotations

import msgspec

from filledfirst.contracts.search import Drift, ResultRecord, SearchBounds, SearchRecord, Slo, StopReason
from filledfirst.frontier.verdict import wilson

from helpers.synthetic_db import every, gauges, queue


def search_record(frontier="knee", setting="default", lo=4.0, hi=4.4, reason="converged", error=None,
                  start=1.0) -> SearchRecord:
    """A search without probes, ended with the bracket [lo, hi) for `reason`."""
    return SearchRecord(
        frontier=frontier, setting=setting, workload="paced", fingerprint="x", slo=Slo(ttft_ms=500.0, itl_ms=100.0),
        probe_s=10.0, probe_lifetimes=4.0, probe_max_s=120.0, bounds=SearchBounds(start=start, maximum=16.0),
        probes=[], result=ResultRecord(lo=lo, hi=hi, ratio=None if lo is None or hi is None else hi / lo,
                                       reason=StopReason(reason), error=error))


SLO = {"ttft_ms": 500.0, "itl_ms": 100.0}


def probe_run(frontier, setting, probe, rate, attainment, servers, service_s, cap=64, kv=lambda n: 0.5 * n,
              missed=None, seconds=20):
    reqs = queue(every(1 / rate, int(rate * seconds)), service_s, servers)
    n = len(reqs)
    lo, hi = wilson(round(attainment * n), n, 0.9)
    held = attainment >= 0.95  # these synthetic probes are judged by their share alone
    block = {"name": frontier, "setting": setting, "probe": probe, "rate": rate, "probe_s": seconds, "slo": SLO,
             "target": 0.95, "requests": n, "met": round(attainment * n), "attainment": attainment,
             "attainment_lo": lo, "attainment_hi": hi, "backlog_growth": 0.0,
             "verdict": "held" if held else "broke", "held": held,
             "missed": missed or {"failed": 0, "ttft": round((1 - attainment) * n), "itl": 0}, "error": None}
    return {"run_id": f"{frontier}/{setting}/p{probe:02d}-x", "cap": cap, "requests": reqs,
            "samples": gauges(reqs, seconds + 3 * service_s + 60, kv),
            # the part the runner writes into a probe's run.json
            "meta": {"workload": "light", "part": "frontier", "frontier": block, "scrape": {"interval_s": 0.25}}}


def cap_probes() -> list[dict]:
    """Two searches of frontier `cap`, and seq8's search.json (its bracket)."""
    return [
        # cap 8, 1.2 s a request: holds 2 and 4 req/s, breaks at 8 (a queue at the cap)
        probe_run("cap", "seq8", 1, 2.0, 1.0, 8, 1.2, cap=8),
        probe_run("cap", "seq8", 2, 4.0, 1.0, 8, 1.2, cap=8),
        probe_run("cap", "seq8", 3, 8.0, 0.3, 8, 1.2, cap=8),
        probe_run("cap", "seq8", 4, 5.657, 0.97, 8, 1.2, cap=8),
        # no queue anywhere, yet 2 req/s breaks: its requests stall between tokens
        probe_run("cap", "slow", 1, 1.0, 1.0, 64, 0.5),
        probe_run("cap", "slow", 2, 2.0, 0.25, 64, 0.5, missed={"failed": 1, "ttft": 2, "itl": 27}),
    ]


# seq8's search from a capacity estimate, its interval and a drift past drift_max.
_SEQ8 = search_record("cap", "seq8", lo=5.657, hi=8.0, reason="budget")
SEQ8_SEARCH = msgspec.structs.replace(
    _SEQ8, result=msgspec.structs.replace(_SEQ8.result, floor=5.657 / 1.1, confidence=0.9), estimate_rps=6.6,
    drift=Drift(start_rps=6.6, end_rps=5.7, change=5.7 / 6.6 - 1, max_change=0.1, drifted=True)).to_doc()

