"""The tables of docs/results.md from a study's database: the capacity searches (table
`frontiers`) and every run with its label (tables `runs`, `diagnosis` and the signals).

    .venv/bin/python tools/study_tables.py results/filledfirst.duckdb
"""

from __future__ import annotations

import sys

import duckdb

from filledfirst.analysis import signals


def _n(x, fmt="{:,.0f}") -> str:
    return "-" if x is None else fmt.format(x)


def not_probe(con) -> str:
    """SQL over `runs r`: not a capacity-search probe (a database ingested before runs had
    the column: from run.json itself)."""
    cols = {c for (c,) in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'runs'").fetchall()}
    return "r.frontier IS NULL" if "frontier" in cols else "json_extract(r.meta, '$.frontier') IS NULL"


def frontiers(con) -> None:
    print("| search | setting | probes | held at (req/s) | broke at (req/s) | output tok/s at the knee "
          "| what filled first at the knee | first crossings (req/s): waiting / cap / KV / TTFT p95 |")
    print("|---|---|---:|---:|---:|---:|---|---|")
    for r in con.execute("""SELECT frontier, setting, probes, lo_rps, hi_rps, lo_output_tok_s, knee_label,
                                   waiting_from_rps, cap_from_rps, kv_full_from_rps, ttft_p95_from_rps
                            FROM frontiers ORDER BY frontier, setting""").fetchall():
        f, s, probes, lo, hi, tok, label, w, cap, kv, ttft = r
        print(f"| {f} | {s} | {probes} | {_n(lo, '{:.3g}')} | {_n(hi, '{:.3g}')} | {_n(tok)} | {label} | "
              f"{_n(w, '{:.3g}')} / {_n(cap, '{:.3g}')} / {_n(kv, '{:.3g}')} / {_n(ttft, '{:.3g}')} |")


def runs(con) -> None:
    summary = {r["run_id"]: r for r in signals.run_summary(con).to_dicts()}
    rows = con.execute("""SELECT d.run_id, d.experiment, d.expect, d.label
                          FROM diagnosis d JOIN runs r USING (run_id)
                          WHERE {NOT_PROBE} ORDER BY r.started_at""".format(NOT_PROBE=not_probe(con))).fetchall()
    print("| run | offered (req/s) | requests | TTFT p50 / p90 (ms) | ITL p50 (ms) | running median / max (cap) "
          "| waiting max | KV median / max (%) | preemptions | vLLM's queue share of TTFT | label | designed for |")
    print("|---|---:|---:|---|---:|---|---:|---|---:|---:|---|---|")
    shares = {r[0]: r[1] for r in con.execute(
        "SELECT run_id, window_queue_share FROM diagnosis").fetchall()}
    offered = {r[0]: r[1] for r in con.execute(
        f"SELECT run_id, offered_rps FROM ({signals.OFFERED})").fetchall()}
    for run_id, exp, expect, label in rows:
        s = summary[run_id]
        share = shares.get(run_id)
        print(f"| {exp} | {_n(offered.get(run_id), '{:.3g}')} | {s['n_requests']:,} | "
              f"{_n(s['ttft_p50_ms'])} / {_n(s['ttft_p90_ms'])} | {_n(s['itl_p50_ms'], '{:.1f}')} | "
              f"{_n(s['running_median'], '{:g}')} / {_n(s['running_max'], '{:g}')} ({_n(s['max_num_seqs'], '{:g}')}) | "
              f"{_n(s['waiting_max'], '{:g}')} | "
              f"{_n(s['kv_median_pct'], '{:.1f}')} / {_n(s['kv_max_pct'], '{:.0f}')} | "
              f"{_n(s['preemptions'], '{:g}')} | {_n(share, '{:.0%}')} | {label} | {expect or ''} |")


def ttft_parts(con) -> None:
    """Where TTFT went, per run and role, around its p50 and p90 (request_path.ttft_parts)."""
    from filledfirst.analysis import request_path

    print("| run | role | TTFT p50: dispatch / front end / vLLM queue / vLLM prefill (ms) "
          "| TTFT p90: dispatch / front end / vLLM queue / vLLM prefill (ms) |")
    print("|---|---|---|---|")
    runs = con.execute(f"SELECT run_id, experiment FROM runs r WHERE {not_probe(con)} ORDER BY started_at").fetchall()
    cols = [c for c, _ in request_path.TTFT_PARTS]
    for run_id, exp in runs:
        by_role: dict[str, dict[float, dict]] = {}
        for row in request_path.ttft_parts(con, run_id).to_dicts():
            by_role.setdefault(row["role"], {})[row["q"]] = row
        for role, qs in by_role.items():
            cells = []
            for q in (0.5, 0.9):
                r = qs.get(q) or {}
                cells.append("not reported by the server" if r.get(cols[-1]) is None
                             else f"{_n(r.get('ttft_ms'))} = " + " / ".join(_n(r.get(c), "{:,.1f}") for c in cols))
            print(f"| {exp} | {role} | {cells[0]} | {cells[1]} |")


def prefix_cache(con) -> None:
    """The runs whose schedule had prefix blocks: the ideal against what the cache served,
    over all their requests (analysis.prefix_cache.counts) and over the loaded window
    (the diagnosis)."""
    from filledfirst.analysis.prefix_cache import counts

    print("| run | caching | requests | prompt tokens from the cache: ideal / served / server's counters "
          "| loaded window: ideal / served (efficiency) | TTFT p50 (ms) | label |")
    print("|---|---|---:|---|---|---:|---|")
    summary = {r["run_id"]: r for r in signals.run_summary(con).to_dicts()}
    diag = {r[0]: r[1:] for r in con.execute(
        "SELECT run_id, prefix_caching, ideal_hit_share, measured_hit_share, cache_efficiency, label "
        "FROM diagnosis").fetchall()}
    names = dict(con.execute("SELECT run_id, experiment FROM runs").fetchall())
    for c in counts(con).filter(counts(con)["n_with_ideal"] > 0).to_dicts():
        run_id = c["run_id"]
        if run_id not in names or run_id not in diag or "/" in names[run_id]:
            continue  # a probe's share is in its search
        caching, ideal, served, eff, label = diag[run_id]
        print(f"| {names[run_id]} | {'on' if caching else 'off'} | {summary[run_id]['n_requests']:,} | "
              f"{_n(c['ideal_share'], '{:.1%}')} / {_n(c['answers_share'], '{:.1%}')} / "
              f"{_n(c['server_share'], '{:.1%}')} | {_n(ideal, '{:.1%}')} / {_n(served, '{:.1%}')} "
              f"({_n(eff, '{:.0%}')}) | {_n(summary[run_id]['ttft_p50_ms'])} | {label} |")


def main() -> None:
    con = duckdb.connect(sys.argv[1] if len(sys.argv) > 1 else "results/filledfirst.duckdb", read_only=True)
    frontiers(con)
    print()
    runs(con)
    print()
    ttft_parts(con)
    print()
    prefix_cache(con)
    n, ok = con.execute("SELECT count(*), count(*) FILTER (WHERE status = 'ok') FROM requests").fetchall()[0]
    print(f"\nrequests: {ok:,} ok of {n:,} (runs and probes)")


if __name__ == "__main__":
    main()
