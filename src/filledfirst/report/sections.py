"""The report's sections, in its order: each takes the loaded `ReportData` and returns the
section's HTML blocks (escaped already), so reports/report.qmd holds only the headings,
the prose and one loop per section, and what the report shows is tested here."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Mapping

import msgspec

from filledfirst.analysis import prefix_cache as prefix_cache_stats
from filledfirst.analysis import request_path, signals, step_time
from filledfirst.analysis.diagnosis import scheduler
from filledfirst.report import charts, frontiers, markup, parts, patterns, run_json, tables
from filledfirst.report.data import ReportData
from filledfirst.report.rows import ClientCheck, RequestCheck, RunRow, TtftCheck, TtftPart

# Usually the same for every run: shown once, and only what differs per run.
SHARED_SETUP = ("model", "versions", "hardware")
# Per run by nature: each folded away whole.
PER_RUN_SETUP = (("server.settings", "server settings"), ("schedule", "schedule"), ("timings", "timings"))
# The measurement checks' rows: each measured run's summary with its client checks, and our
# TTFT against vLLM's by run id.
class _Checks(msgspec.Struct, frozen=True):
    """The measurement checks of every measured run (probes included)."""

    runs: list[RunRow]  # the runs with at least one request
    clients: dict[str, ClientCheck]  # the client's own load, per run id
    ttft: dict[str, TtftCheck]  # our TTFT beside vLLM's histogram, per run id


def _no_diagnosis() -> str:
    return markup.para("No diagnosis in this database: run `filledfirst diagnose --db FILE`.")


def page_head() -> list[str]:
    """Once per page, before any chart: the offline Vega bundle and the table style."""
    return [charts.vega_bundle_html() + markup.style_html()]


def study_head(data: ReportData, rendered: datetime) -> list[str]:
    """When the study was measured and this page made, and what it ran on, in one table:
    model, engine, devices, versions (a key the runs disagree on says so; Setup has each
    run's value)."""
    starts = sorted(m.started_at for m in data.metas.values() if m.started_at)
    ends = sorted(t for m in data.metas.values() if (t := m.finished_at or m.started_at))
    when = (f"Measured {_span(starts[0], ends[-1])} UTC ({len(data.experiments)} runs, {len(data.probes)} "
            f"capacity-search probes)" if starts else "No run recorded when it started")
    left_out = "; host names and server command lines left out" if data.published else ""
    out = [markup.para(f"{when}. This page was made {rendered.astimezone(UTC):%Y-%m-%d %H:%M} UTC{left_out}.")]
    _, common, differing = shared_setup(data.documents)
    if common or differing:
        def value(*keys: str) -> str:
            if any(k in differing for k in keys):
                return _VARIES
            return " ".join(run_json.fmt_value(common[k]) for k in keys if common.get(k) not in (None, [], ""))

        gpus = common.get("hardware.gpus")
        devices = (value("hardware.gpus") if gpus or "hardware.gpus" in differing else
                   value("hardware.cpu") + (f", {common['hardware.cores']} cores" if "hardware.cores" in common else "")
                   + (f", {common['hardware.memory_gib']} GiB" if "hardware.memory_gib" in common else ""))
        rows = [("model", value("model.name", "model.dtype")),
                ("engine", vllm if (vllm := value("versions.vllm")) in ("", _VARIES) else f"vLLM {vllm}"),
                ("devices", devices),
                ("host", value("hardware.host")),
                ("versions", ", ".join(f"{name} {v}" for name, key in _VERSIONS if (v := value(key)))),
                ("source", value("versions.filledfirst_commit"))]
        out.append(markup.html_table(["setup", ""], [(k, v) for k, v in rows if v]))
    return out


_VARIES = "differs between runs (Setup)"
# The versions the setup table names, beside the engine's.
_VERSIONS = (("Python", "versions.python"), ("torch", "versions.torch"), ("filledfirst", "versions.filledfirst"))


def _span(start: str, end: str) -> str:
    """Two ISO times as 'YYYY-MM-DD HH:MM to HH:MM' (the second's date when it differs)."""
    a, b = (datetime.fromisoformat(t).astimezone(UTC) for t in (start, end))
    return f"{a:%Y-%m-%d %H:%M} to {b:%H:%M}" if a.date() == b.date() else f"{a:%Y-%m-%d %H:%M} to {b:%Y-%m-%d %H:%M}"


def compare_link(href: str | None) -> list[str]:
    """A line to the study's comparison with its baseline, when the workflow made one."""
    if not href:
        return []
    return [f"<p>Compared with its baseline: <a href='{markup.esc(href)}'>what changed, and whether it is "
            "more than noise</a>.</p>"]


def at_a_glance(data: ReportData) -> list[str]:
    if not (data.diagnosis or data.frontier_rows):
        return [_no_diagnosis()]
    glance = frontiers.summary_rows(data.diagnosis, data.metas, data.frontier_rows, data.rules,
                                    list(data.study_parts))
    return [frontiers.summary_table(glance)]


def runs_sentence(summary: list[RunRow]) -> str:
    n_failed = sum(r.status == "failed" for r in summary)
    n_partial = sum(r.status == "partial" for r in summary)
    return (f"{len(summary)} runs: {len(summary) - n_failed - n_partial} complete, "
            f"{n_partial} cut short, {n_failed} failed.")


def not_ok_sentence(r: RunRow) -> str:
    return (f"{r.run_id} {'failed' if r.status == 'failed' else 'was cut short'}: "
            f"{r.error or 'no error recorded'}")


def probes_sentence(n: int) -> str:
    return (f"The capacity searches' {n} probe run{'s' if n != 1 else ''} are not runs of the study: "
            "they are shown under Capacity search, search by search.")


def runs(data: ReportData) -> list[str]:
    """The study's own runs; the capacity searches' probes only counted."""
    out = [markup.para(runs_sentence(data.experiments)), tables.runs_table(data.experiments)]
    if data.probes:
        out.append(markup.para(probes_sentence(len(data.probes))))
    out += [markup.para(not_ok_sentence(r)) for r in data.experiments if r.status != "ok"]
    return out


def what_filled_first(data: ReportData) -> list[str]:
    if not data.diagnosis:
        return [_no_diagnosis()]
    designed = [d for d in data.diagnosis if d.run_id not in data.is_probe]
    out = [patterns.patterns_table(designed), *patterns.engines_cannot(data.diagnosis),
           patterns.evidence_intro(data.rules), patterns.evidence_table(designed, data.rules)]
    open_loop = [
        (d, data.rates[d.run_id]) for d in designed
        if d.run_id in data.rates and d.goodput_rps is not None
        and not (d.run_id in data.metas and data.metas[d.run_id].closed_loop)
    ]
    if open_loop:
        out.append(charts.embed(charts.goodput_chart(open_loop)))
    return out


def part_by_part(data: ReportData) -> list[str]:
    return parts.parts_html(data.study_parts, data.measured, data.part_of, roles=data.roles, rates=data.rates,
                            queue_shares=data.queue_shares, metas=data.metas, prefix_cache=data.prefix_cache,
                            frontier_rows=data.frontier_rows, labels={d.run_id: d.label for d in data.diagnosis})


def capacity_search_heading(data: ReportData) -> list[str]:
    """The section's heading, in Markdown (the report's table of contents lists it): none
    for a study without capacity searches."""
    return ["## Capacity search"] if data.frontier_rows or data.probe_points else []


def capacity_search(data: ReportData) -> list[str]:
    """The capacity searches (docs/capacity-search.md), under `capacity_search_heading`:
    nothing at all for a study without. Per frontier its chart and table, then each
    search's probes folded away: the probes appear nowhere else in the report."""
    if not capacity_search_heading(data):
        return []
    out = [markup.para(
        "Each probe replays the frontier's workload at one rate; attainment is the share of its "
        "requests that met the SLO. The leading signal is the scheduler signal that crossed at the "
        "lowest probed rate (a queue, running at the cap, KV full) and how far below the rate where "
        "the SLO broke. Under each frontier's table, each search's probes, folded away.")]
    checks = _measurement_context(data)
    for name, rows, points in frontiers.by_frontier(data.frontier_rows, data.probe_points):
        out.append(markup.heading(f"Frontier {name}"))
        if rows:
            out.append(markup.para(frontiers.frontier_intro(rows)))
            if points:
                out.append(charts.embed(frontiers.frontier_chart(rows, points)))
            out.append(frontiers.frontier_table_html(rows))
            if any(r.prediction for r in rows):
                out.append(markup.para(
                    "Predicted against measured: the knee of every limit from the setting's fitted step time "
                    "(Measurement checks), its limits and the workload's requests, in a mean model of the engine "
                    "at a steady rate (docs/capacity-search.md). The smallest is what fills first. The last "
                    "column is the smallest change of one limit the model says moves the knee by the least "
                    "shift that counts; a prediction until a search has checked it."))
                out.append(frontiers.predicted_table_html(rows))
            if frontiers.moved_rows(rows):
                out.append(markup.para(
                    "What moved the knee: each verified setting with one limit relaxed (its table row "
                    "says how far), searched again from its predicted knee or, where it reads not searched, "
                    "only measured side by side with it. The intervention that relaxes what filled first "
                    "must move the knee (or the completions per second side by side), and the control "
                    "(the other limit relaxed as far) must not."))
                out.append(frontiers.moved_table_html(rows))
        else:
            out.append(_no_diagnosis())
        out += [search_probes(data, setting, probes, checks)
                for setting, probes in frontiers.by_setting(rows, points) if probes]
    return out


def search_probes(data: ReportData, setting: str, points: list[frontiers.ProbePoint], checks: _Checks) -> str:
    """One search's probes, folded: a line per probe, then what the report shows of the
    study's runs elsewhere (the diagnosis' evidence, the measurement checks) for these
    probes, and the search's server command."""
    ids = {p.run_id for p in points}
    diagnosed = [d for d in data.diagnosis if d.run_id in ids]
    inner = [frontiers.probe_table_html(points, {d.run_id: d.label for d in diagnosed})]
    if diagnosed:
        inner += [markup.para("The diagnosis' evidence, probe by probe (columns as under What filled up first):"),
                  patterns.evidence_table(diagnosed, data.rules)]
    measured = [r for r in checks.runs if r.run_id in ids]
    if measured:
        inner += [markup.para("Measurement checks, probe by probe (columns as under Measurement checks):"),
                  tables.measurement_table(measured, checks.clients, checks.ttft)]
    argv = next((a for p in points if (a := data.metas[p.run_id].server.argv)), None)
    if argv:  # a search runs its probes on one server start
        inner.append(markup.code_details("server command", run_json.fmt_value(argv)))
    return markup.details_html(frontiers.probes_summary(setting, points), "".join(inner))


def shared_setup(documents: Mapping[str, run_json.JsonObject]
                 ) -> tuple[dict[str, dict[str, object]], dict[str, object], list[str]]:
    """The SHARED_SETUP sections of each run.json flattened ("model.name", ...), what every
    run agrees on, and the keys that differ."""
    setup = {
        run_id: {f"{s}.{k}": v for s in SHARED_SETUP for k, v in run_json.section(m, s).items()}
        for run_id, m in documents.items()
    }
    common, differing = run_json.split_common(setup)
    return setup, common, differing


def setup(data: ReportData) -> list[str]:
    """What every run shared (the probes too: they ran on the same model and machine), and
    per run of the study what differs; a search's probes have their server command under
    Capacity search."""
    out = []
    by_run, common, differing = shared_setup(data.documents)
    by_run = {run_id: v for run_id, v in by_run.items() if run_id not in data.is_probe}
    documents = {run_id: d for run_id, d in data.documents.items() if run_id not in data.is_probe}
    if common:
        out.append(run_json.key_value_table(common, caption="shared by every run"))
    if differing and by_run:
        out.append(markup.details_html("what differs between runs (model, versions, hardware)",
                                       run_json.keys_by_run_table(by_run, differing)))
    for path, caption in PER_RUN_SETUP:
        per_run = {run_id: run_json.section(m, path) for run_id, m in documents.items()}
        keys = list(dict.fromkeys(k for v in per_run.values() for k in v))
        if keys:  # every key of every run (the schedule's stats too): folded away
            out.append(markup.details_html(f"{caption}, per run ({len(keys)} keys)",
                                           run_json.keys_by_run_table(per_run, keys)))
    for run_id, m in data.metas.items():
        argv = m.server.argv
        if argv and run_id not in data.is_probe:
            out.append(markup.code_details(f"{run_id}: server command", run_json.fmt_value(argv)))
    return out


def side_by_side(data: ReportData) -> list[str]:
    if not data.measured:
        return [markup.para("No run measured any request.")]
    return [tables.compare_table(data.measured)]


def _measurement_context(data: ReportData) -> _Checks:
    """The measurement checks of every measured run, probes included: read once for the
    study's runs and once for the probes."""
    rows = [r for r in data.summary if r.n_requests]
    if not rows:
        return _Checks([], {}, {})
    checks = {c.run_id: c for c in TtftCheck.of(signals.ttft_against_server(data.con))}
    clients = {run_id: msgspec.convert(c, ClientCheck) for run_id, c in signals.client_checks(data.con).items()}
    return _Checks(rows, clients, checks)


def measurement_checks(data: ReportData) -> list[str]:
    """Our client and our TTFT beside vLLM's histogram, per run."""
    if not data.measured:
        return []
    checks = _measurement_context(data)
    return [tables.measurement_table([r for r in checks.runs if r.run_id not in data.is_probe], checks.clients,
                                     checks.ttft)]


def step_times(data: ReportData) -> list[str]:
    """Each server setting's fitted step time, and the intervals it was fitted on."""
    models = step_time.read(data.con)
    if not models:
        return []

    def ms(value: float | None, se: float | None) -> str:
        return "-" if value is None else f"{value:.3g}" + ("" if se is None else f" ± {se:.2g}")

    table = markup.column_table([
        ("setting (its runs)", lambda m: m.runs if m.scope is step_time.Scope.SETTING else "the engine: every setting"),
        ("intervals", lambda m: f"{m.intervals:,}"),
        ("ms a step", lambda m: ms(m.base_ms, m.base_se_ms)),
        ("ms a token", lambda m: ms(m.per_token_ms, m.per_token_se_ms)),
        ("ms a sequence", lambda m: ms(m.per_seq_ms, m.per_seq_se_ms)),
        ("ms a 1,000 tokens held", lambda m: ms(m.per_context_ms, m.per_context_se_ms)),
        ("r2", lambda m: "-" if m.r2 is None else f"{m.r2:.2f}"),
        ("client ITL p50 / modelled step", lambda m: "-" if m.itl_ratio is None else f"{m.itl_ratio:.2f}"),
        ("predicts with", lambda m: "itself" if m.determined else "the engine's"),
    ], models)
    return [markup.para("The engine's step time per server setting, fitted from the intervals between scrapes: "
                        "a step's milliseconds = a base + a cost per token in the step + a cost per sequence "
                        "running + a cost per 1,000 tokens the running sequences hold in the KV cache (± a standard "
                        "error; none where the runs did not vary that term, and no cost of context where the runs "
                        "did not vary it apart from the sequences). The last "
                        "column checks it against what it was not fitted on: a decoding request's gaps between "
                        "tokens are step times. A setting whose own fit does not separate the terms (or explains "
                        f"less than {step_time.MIN_R2:.0%} of its steps' variance) predicts with the engine's fit over "
                        "every setting: the settings differ in their limits, not in the cost of a token."),
            table, charts.embed(charts.step_time_chart(step_time.fitted_points(data.con, data.metas, models)))]


def request_checks(data: ReportData) -> list[str]:
    """The same check request by request, where vLLM sent its per-request timings."""
    if not data.measured:
        return []
    ids = {r.run_id for r in data.measured}
    return [tables.request_check_table(
        [c for c in RequestCheck.of(request_path.against_server(data.con)) if c.run_id in ids])]


def each_run(data: ReportData) -> list[str]:
    """A section per run of the study; the probes have none (each run folder holds all it
    measured)."""
    out = []
    for r in data.experiments:
        out += run_section(data, r)
    return out


def run_section(data: ReportData, r: RunRow) -> list[str]:
    run_id = r.run_id
    out = [markup.heading(f"{run_id} ({r.experiment})")]
    if r.description:
        out.append(markup.para(r.description))
    if r.n_requests == 0:
        out.append(markup.para(f"Nothing was measured. Status {r.status}: {r.error or 'no error recorded'}"))
        return out
    out.append(markup.para(tables.run_sentence(r)))
    workload = tables.schedule_sentence(data.metas[run_id].schedule.stats if run_id in data.metas else None)
    if workload:
        out.append(markup.para(workload))
    out.append(tables.run_signal_table(r))
    run_roles = [x for x in data.roles if x.run_id == run_id]
    if len(run_roles) > 1:
        out.append(tables.role_table(run_roles))
    ttft_parts = TtftPart.of(request_path.ttft_parts(data.con, run_id))
    out.append(markup.para(tables.ttft_parts_sentence(ttft_parts)))
    if any(x.n_timed for x in ttft_parts):
        out.append(charts.embed(charts.ttft_parts_chart(ttft_parts)))
    chart = charts.run_chart(
        signals.request_points(data.con, run_id), signals.timeseries(data.con, run_id), r.max_num_seqs,
        scheduler.held_over_time(data.con, run_id),
    )
    out.append(charts.embed(chart))
    out += prefix_cache(data, run_id)
    return out


def prefix_cache(data: ReportData, run_id: str) -> list[str]:
    """A run whose schedule had prefix blocks: the cache's delivery against the ideal."""
    shares = prefix_cache_stats.over_time(data.con, run_id)
    row = data.prefix_cache.get(run_id)
    if shares.is_empty() or row is None:
        return []
    return [markup.para(tables.prefix_cache_sentence(row)),
            charts.embed(charts.prefix_cache_chart(shares, row.n_unreported or 0))]
