"""The study's sections in the report: one table per section (the config's `sections`, kept
in the database by `filledfirst diagnose` as table `study_parts`), with the runs whose
experiment names it as their `section` as columns, and another study's figures beside them
(the original study's, src/filledfirst/sections/original-study.yaml). A run whose section the
database does not describe still gets a table of the general rows under its section's name:
nothing measured is left out."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from filledfirst.analysis import numbers
from filledfirst.contracts.frontiers import FrontierRow
from filledfirst.contracts.runmeta import RunMeta
from filledfirst.report import frontiers, markup, tables
from filledfirst.report.markup import html_table
from filledfirst.report.rows import PrefixCacheRow, RoleRow, RunRates, RunRow, SweepLine
from filledfirst.report.tables import cap_suffix, requests_cell
from filledfirst.schema import schema_default
from filledfirst.study import Section, sweep_of

_Row = tuple[str, Callable[[RunRow, PrefixCacheRow | None], str]]

# Every row a signals table can hold: (label, formatter of a run_summary row and its
# prefix cache counts, None for a run whose schedule had no prefix blocks). The
# config schema's `parts.*.rows` enum lists the same keys (a test holds them equal).
ROWS: dict[str, _Row] = {
    "requests_failed": ("requests (failed)", lambda r, _: f"{requests_cell(r)} ({r.n_failed:,})"),
    "running_median": ("running (median)", lambda r, _: numbers.count(r.running_median) + cap_suffix(r)),
    "running_max": ("running (max)", lambda r, _: numbers.count(r.running_max) + cap_suffix(r)),
    "running_median_max": ("running (median / max)", lambda r, _: (
        f"{numbers.count(r.running_median)} / {numbers.count(r.running_max)}{cap_suffix(r)}")),
    "waiting_median": ("waiting (median)", lambda r, _: numbers.count(r.waiting_median)),
    "waiting_max": ("waiting (max)", lambda r, _: numbers.count(r.waiting_max)),
    "waiting_median_max": ("waiting (median / max)",
                           lambda r, _: f"{numbers.count(r.waiting_median)} / {numbers.count(r.waiting_max)}"),
    "kv_median": ("KV (median)", lambda r, _: numbers.percent(r.kv_median_pct)),
    "kv_max": ("KV (max)", lambda r, _: numbers.percent(r.kv_max_pct)),
    "kv_median_max": ("KV (median / max)",
                      lambda r, _: f"{numbers.percent(r.kv_median_pct)} / {numbers.percent(r.kv_max_pct)}"),
    "preemptions": ("preemptions", lambda r, _: numbers.count(r.preemptions)),
    "ttft_p50": ("TTFT p50", lambda r, _: numbers.ms(r.ttft_p50_ms)),
    "ttft_p90": ("TTFT p90", lambda r, _: numbers.ms(r.ttft_p90_ms)),
    "itl_p50": ("ITL p50", lambda r, _: numbers.ms(r.itl_p50_ms)),
    # analysis.prefix_cache.counts' shares, for runs whose schedule had prefix blocks
    "prefix_hits": ("prompt tokens from the cache (ideal / served)",
                    lambda _, c: f"{numbers.share(c and c.ideal_share)} / {numbers.share(c and c.answers_share)}"),
}
# A part that names no rows, and a part the database does not describe.
DEFAULT_ROWS = ["requests_failed", "running_median_max", "waiting_median_max", "kv_median_max", "preemptions",
                "ttft_p50", "ttft_p90", "itl_p50"]

def signals_table(part: Section, rows: Sequence[RunRow], prefix_cache: Mapping[str, PrefixCacheRow]) -> str:
    """Signals as rows, one column per run of the part, then the reference columns."""
    keys = part.rows or DEFAULT_ROWS
    body = ([ROWS[k][0], *(ROWS[k][1](r, prefix_cache.get(r.run_id)) for r in rows),
             *(col.get(k, "") for col in part.reference.values())]
            for k in keys)
    return html_table(["", *(r.experiment for r in rows), *part.reference], body, caption=_reference_from(part))


def _reference_from(part: Section) -> str | None:
    """Whose the reference columns are, where the part has any."""
    if not (part.reference or part.reference_roles or part.reference_sweep):
        return None
    return f"Reference: {part.reference_from or 'another study'}; comparable with ours only on the same setup."


def reference_sweep_table(part: Section) -> str:
    return html_table(["concurrency (reference)", "TTFT p50", "TTFT p95", "tok/s per request", "total tok/s"],
                      ([x.concurrency, x.ttft_p50, x.ttft_p95, x.tok_s_per_request, x.total_tok_s]
                       for x in part.reference_sweep),
                      caption=_reference_from(part))


def reference_roles_table(part: Section) -> str:
    return html_table(["role (reference)", "n", "TTFT p50", "TTFT p90", "ITL p50"],
                      ([x.role, x.n, x.ttft_p50, x.ttft_p90, x.itl_p50] for x in part.reference_roles),
                      caption=_reference_from(part))


def part_blocks(part: Section, rows: Sequence[RunRow], *, roles: Sequence[RoleRow],
                rates: Mapping[str, RunRates], queue_shares: Mapping[str, float | None],
                metas: Mapping[str, RunMeta], prefix_cache: Mapping[str, PrefixCacheRow],
                frontier_rows: Sequence[FrontierRow], labels: Mapping[str, str | None]) -> list[str]:
    """The HTML of one part: heading, its table, and what goes with it (`prefix_cache`:
    analysis.prefix_cache.counts per run id; `frontier_rows`: table `frontiers`; `labels`:
    the diagnosis' label per run id)."""
    from filledfirst.report import charts

    out = [markup.heading(part.title)]
    if part.table == "roles":
        out.append(tables.interference_table(roles, {r.run_id: r.experiment for r in rows}))
        if part.reference_roles:
            out.append(reference_roles_table(part))
        return out
    if part.table == "sweep":
        lines = [
            SweepLine(run=r, rates=rates.get(r.run_id) or RunRates(run_id=r.run_id),
                      queue_share=queue_shares.get(r.run_id),
                      concurrency=metas[r.run_id].concurrency if r.run_id in metas else None,
                      label=labels.get(r.run_id), sweep=sweep_of(r.experiment or r.run_id))
            for r in rows]
        order = list(dict.fromkeys(line.sweep for line in lines))  # the study's order of sweeps
        sweep = sorted(lines, key=lambda x: (order.index(x.sweep), x.concurrency or 0))
        out.append(tables.sweep_table(sweep))
        if part.reference_sweep:
            out.append(reference_sweep_table(part))
        out.append(charts.embed(charts.sweep_chart(sweep)))
        return out
    out.append(signals_table(part, rows, prefix_cache))
    for r in rows:  # where a trace window or a knee-relative rate put the run
        meta = metas.get(r.run_id)
        sentence = tables.schedule_sentence(meta.schedule.stats) if meta is not None else ""
        if sentence:
            out.append(markup.para(f"{r.experiment}: {sentence}"))
    knees = [r for r in frontier_rows if r.frontier == part.knees]
    if knees:
        out.append(markup.para(f"The knees of frontier {part.knees} (its searches, in the capacity search):"))
        least = schema_default("frontiers", "*", "interventions", "min_shift")
        out.append(frontiers.knee_shift_table_html(knees, least))
    return out


def parts_html(parts: Mapping[str, Section], measured: Sequence[RunRow], part_of: Mapping[str, str | None],
               **context: Any) -> list[str]:
    """Every part with runs, in the study's order; then parts the database does not
    describe, under their own names, with the general rows."""
    by_part: dict[str, list[RunRow]] = {}
    for r in measured:
        name = part_of.get(r.run_id)
        if name is not None:
            by_part.setdefault(name, []).append(r)
    out: list[str] = []
    for name in [*parts, *sorted(set(by_part) - set(parts))]:
        if by_part.get(name):
            out += part_blocks(parts.get(name) or Section(title=name), by_part[name], **context)
    return out
