"""The report's sections, in its order: each takes the loaded `ReportData` and returns the
section's HTML blocks (escaped already), so reports/report.qmd holds only the headings,
the prose and one loop per section, and what the report shows is tested here."""

from __future__ import annotations

from typing import Any, Mapping

from filledfirst.analysis import request_path, signals
from filledfirst.report import charts, frontiers, markup, parts, patterns, run_json, tables
from filledfirst.report.data import ReportData

# Usually the same for every run: shown once, and only what differs per run.
SHARED_SETUP = ("model", "versions", "hardware")
# Per run by nature: each folded away whole.
PER_RUN_SETUP = (("server.settings", "server settings"), ("schedule", "schedule"), ("timings", "timings"))


def _no_diagnosis() -> str:
    return markup.para("No diagnosis in this database: run `filledfirst diagnose --db FILE`.")


def _probes_summary(n: int) -> str:
    return f"the capacity searches' probes ({n} runs)"


def page_head() -> list[str]:
    """Once per page, before any chart: the offline Vega bundle and the table style."""
    return [charts.vega_bundle_html() + markup.style_html()]


def at_a_glance(data: ReportData) -> list[str]:
    if not (data.diagnosis or data.frontier_rows):
        return [_no_diagnosis()]
    glance = frontiers.summary_rows(data.diagnosis, data.metas, data.frontier_rows, data.rules,
                                    list(data.study_parts))
    return [frontiers.summary_table(glance)]


def runs_sentence(summary: list[dict[str, Any]]) -> str:
    n_failed = sum(r["status"] == "failed" for r in summary)
    n_partial = sum(r["status"] == "partial" for r in summary)
    return (f"{len(summary)} runs: {len(summary) - n_failed - n_partial} complete, "
            f"{n_partial} cut short, {n_failed} failed.")


def not_ok_sentence(r: Mapping[str, Any]) -> str:
    return (f"{r['run_id']} {'failed' if r['status'] == 'failed' else 'was cut short'}: "
            f"{r['error'] or 'no error recorded'}")


def runs(data: ReportData) -> list[str]:
    """Every run; the capacity searches' probes are runs too, listed whole but folded
    away, so the study's own experiments come first."""
    out = [markup.para(runs_sentence(data.summary)), tables.runs_table(data.experiments)]
    if data.probes:
        out.append(markup.details_html(_probes_summary(len(data.probes)), tables.runs_table(data.probes)))
    out += [markup.para(not_ok_sentence(r)) for r in data.experiments if r["status"] != "ok"]
    return out


def what_filled_first(data: ReportData) -> list[str]:
    if not data.diagnosis:
        return [_no_diagnosis()]
    designed = [d for d in data.diagnosis if d["run_id"] not in data.is_probe]
    probed = [d for d in data.diagnosis if d["run_id"] in data.is_probe]
    out = [patterns.patterns_table(designed)]
    if probed:
        out.append(markup.details_html(_probes_summary(len(probed)), patterns.patterns_table(probed)))
    out += [patterns.evidence_intro(data.rules), patterns.evidence_table(designed, data.rules)]
    if probed:
        out.append(markup.details_html(f"evidence of the probes ({len(probed)} runs)",
                                       patterns.evidence_table(probed, data.rules)))
    open_loop = [  # the probes have their own charts, under Capacity search
        {**data.rates[d["run_id"]], **d} for d in designed
        if d["run_id"] in data.rates and d.get("goodput_rps") is not None
        and not (d["run_id"] in data.metas and data.metas[d["run_id"]].closed_loop)
    ]
    if open_loop:
        out.append(charts.embed(charts.goodput_chart(open_loop)))
    return out


def part_by_part(data: ReportData) -> list[str]:
    return parts.parts_html(data.study_parts, data.measured, data.part_of, roles=data.roles, rates=data.rates,
                            queue_shares=data.queue_shares, metas=data.metas)


def capacity_search(data: ReportData) -> list[str]:
    """The capacity searches (docs/capacity-search.md), heading included: nothing at all
    for a study without."""
    out: list[str] = []
    if data.frontier_rows:
        out.append(markup.heading("Capacity search", 2))
        out.append(markup.para(
            "Each probe replays the frontier's workload at one rate; attainment is the share of its "
            "requests that met the SLO. The leading signal is the scheduler signal that crossed at the "
            "lowest probed rate (a queue, running at the cap, KV full) and how far below the rate where "
            "the SLO broke."))
    for name, rows, points in frontiers.by_frontier(data.frontier_rows, data.probe_points):
        out.append(markup.heading(f"Frontier {name}"))
        out.append(markup.para(frontiers.frontier_intro(rows)))
        if points:
            out.append(charts.embed(frontiers.frontier_chart(rows, points)))
        out.append(frontiers.frontier_table_html(rows))
    return out


def shared_setup(documents: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, dict[str, Any]], dict[str, Any],
                                                                      list[str]]:
    """The SHARED_SETUP sections of each run.json flattened ("model.name", ...), what every
    run agrees on, and the keys that differ."""
    setup = {
        run_id: {f"{s}.{k}": v for s in SHARED_SETUP for k, v in run_json.section(m, s).items()}
        for run_id, m in documents.items()
    }
    common, differing = run_json.split_common(setup)
    return setup, common, differing


def setup(data: ReportData) -> list[str]:
    out = []
    by_run, common, differing = shared_setup(data.documents)
    if common:
        out.append(run_json.key_value_table(common, caption="shared by every run"))
    if differing:
        out.append(markup.details_html("what differs between runs (model, versions, hardware)",
                                       run_json.keys_by_run_table(by_run, differing)))
    for path, caption in PER_RUN_SETUP:
        per_run = {run_id: run_json.section(m, path) for run_id, m in data.documents.items()}
        keys = list(dict.fromkeys(k for v in per_run.values() for k in v))
        if keys:  # every key of every run (the schedule's stats too): folded away
            out.append(markup.details_html(f"{caption}, per run ({len(keys)} keys)",
                                           run_json.keys_by_run_table(per_run, keys)))
    for run_id, m in data.metas.items():
        argv = m.server.argv
        if argv and run_id not in data.is_probe:  # a search's probes share their server's command
            out.append(markup.code_details(f"{run_id}: server command", run_json.fmt_value(argv)))
    return out


def side_by_side(data: ReportData) -> list[str]:
    if not data.measured:
        return [markup.para("No run measured any request.")]
    return [tables.compare_table([r for r in data.measured if r["run_id"] not in data.is_probe])]


def measurement_checks(data: ReportData) -> list[str]:
    """Our client and our TTFT beside vLLM's histogram, per run."""
    if not data.measured:
        return []
    checks = {c["run_id"]: c for c in signals.ttft_against_server(data.con).to_dicts()}
    client = signals.client_checks(data.con)
    with_client = [{**r, **client.get(r["run_id"], {})} for r in data.measured]
    out = [tables.measurement_table([r for r in with_client if r["run_id"] not in data.is_probe], checks)]
    if data.probes:
        out.append(markup.details_html(
            _probes_summary(len(data.probes)),
            tables.measurement_table([r for r in with_client if r["run_id"] in data.is_probe], checks)))
    return out


def request_checks(data: ReportData) -> list[str]:
    """The same check request by request, where vLLM sent its per-request timings."""
    if not data.measured:
        return []
    ids = {r["run_id"] for r in data.measured if r["run_id"] not in data.is_probe}
    return [tables.request_check_table(
        [c for c in request_path.against_server(data.con).to_dicts() if c["run_id"] in ids])]


def each_run(data: ReportData) -> list[str]:
    """A section per experiment; the probes are drawn under Capacity search instead."""
    out = []
    if data.probes:
        out.append(markup.para(
            f"The capacity searches' {len(data.probes)} probe runs are listed under Runs (folded away), and drawn "
            "under Capacity search once the database is diagnosed; their own sections are left out here "
            "(each run folder holds all it measured)."))
    for r in data.experiments:
        out += run_section(data, r)
    return out


def run_section(data: ReportData, r: Mapping[str, Any]) -> list[str]:
    run_id = r["run_id"]
    out = [markup.heading(f"{run_id} ({r['experiment']})")]
    if r["description"]:
        out.append(markup.para(r["description"]))
    if r["n_requests"] == 0:
        out.append(markup.para(f"Nothing was measured. Status {r['status']}: {r['error'] or 'no error recorded'}"))
        return out
    out.append(markup.para(tables.run_sentence(r)))
    workload = tables.schedule_sentence(data.metas[run_id].schedule.stats if run_id in data.metas else None)
    if workload:
        out.append(markup.para(workload))
    out.append(tables.run_signal_table(r))
    run_roles = [x for x in data.roles if x["run_id"] == run_id]
    if len(run_roles) > 1:
        out.append(tables.role_table(run_roles))
    ttft_parts = request_path.ttft_parts(data.con, run_id).to_dicts()
    out.append(markup.para(tables.ttft_parts_sentence(ttft_parts)))
    if any(x["n_timed"] for x in ttft_parts):
        out.append(charts.embed(charts.ttft_parts_chart(ttft_parts)))
    chart = charts.run_chart(
        signals.request_points(data.con, run_id), signals.timeseries(data.con, run_id), r["max_num_seqs"]
    )
    out.append(charts.embed(chart))
    return out
