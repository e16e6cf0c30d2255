"""The report's capacity-search part and its one-screen summary, from DuckDB only.

Per frontier: the probes (each an ingested run whose run.json has a `frontier` block,
filledfirst.contracts.runmeta.FrontierProbe; a probe measured twice counts once, its latest run, as in table
`frontiers`), a chart of attainment against offered rate with the knee's bracket, and a
table per setting: what held, what filled first at the knee, which scheduler signal
crossed first and how far ahead of the break, and what would move the knee.

`summary_rows` is the top of the report: one line per designed experiment (by part) and
per (frontier, setting), what filled first and the one number that shows it, and where
the setting was verified, whether relaxing that limit confirmed it and what filled next.

`moved_table_html`: what moved the knee, a line per intervention of a verified setting
(filledfirst.frontier.interventions; roles and verdicts from table `frontiers`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import altair as alt
import duckdb
import polars as pl

from filledfirst.analysis import numbers
from filledfirst.analysis.diagnosis.labels import Label
from filledfirst.analysis.frontiers import NoQueueLabel, lo_ratio, moved, probe_runs
from filledfirst.analysis.numbers import DASH
from filledfirst.contracts.runmeta import RunMeta
from filledfirst.report import charts
from filledfirst.report.markup import Column, column_table, esc, html_table
from filledfirst.store.tables import table_exists
from filledfirst.study import DiagnosisRules

# --- data ------------------------------------------------------------------------------------


def frontier_rows(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Table `frontiers` as dicts ([] when it is missing or empty: a study without searches)."""
    if not table_exists(con, "frontiers"):
        return []
    return pl.from_arrow(con.sql("SELECT * FROM frontiers ORDER BY frontier, setting").to_arrow_table()).to_dicts()


def probe_points(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """One row per probe (its latest run): frontier, setting, probe, rate, probe_s, requests,
    attainment (None for a probe that measured nothing) and its interval (attainment_lo,
    attainment_hi), backlog_growth, verdict, held, lifetime_p90_s, missed (its
    requests that failed, missed the TTFT SLO, missed the ITL SLO: {failed, ttft, itl}; None
    when it failed outright), failed (the probe failed outright, its run failed or it had
    failed requests), n_failed (requests), status, error, run_id."""
    out = []
    for (name, setting), runs in probe_runs(con).items():
        for run in runs:
            p = run.probe
            n_failed = (p.missed or {}).get("failed") or 0
            # as the search reads a probe (run.search): no verdict or an error is a failed probe
            outright = p.attainment is None or bool(p.error)
            out.append({
                "frontier": name, "setting": setting, "probe": p.probe, "rate": p.rate, "probe_s": p.probe_s,
                "requests": p.requests, "attainment": p.attainment, "held": p.held,
                "lifetime_p90_s": p.lifetime_p90_s, "run_id": run.run_id, "status": run.status, "error": p.error,
                "missed": p.missed, "n_failed": n_failed, "verdict": p.verdict,
                "attainment_lo": p.attainment_lo, "attainment_hi": p.attainment_hi,
                "backlog_growth": p.backlog_growth,
                "outright": outright, "failed": outright or n_failed > 0,
            })
    return out


# --- what the table says -----------------------------------------------------------------------

SIGNALS = (  # (column of `frontiers`, how the report names the signal)
    ("waiting_from_rps", "waiting > 0"),
    ("cap_from_rps", "running at the cap"),
    ("kv_full_from_rps", "KV full"),
)


def leading_signal(row: Mapping[str, Any]) -> dict[str, Any]:
    """The scheduler signal that crossed at the lowest probed rate (ties named together),
    that rate, and its lead: hi_rps / that rate (> 1: it crossed before the SLO broke)."""
    crossed = [(row.get(col), name) for col, name in SIGNALS if row.get(col) is not None]
    if not crossed:
        return {"signals": [], "rps": None, "lead": None}
    rps = min(r for r, _ in crossed)
    hi = row.get("hi_rps")
    return {"signals": [n for r, n in crossed if r == rps], "rps": rps,
            "lead": hi / rps if hi is not None and rps > 0 else None}


def leading_text(row: Mapping[str, Any]) -> str:
    lead = leading_signal(row)
    if not lead["signals"]:
        return "none crossed at any probed rate"
    text = f"{' and '.join(lead['signals'])} from {numbers.rps(lead['rps'])}"
    if lead["lead"] is None:
        return text + " (the SLO never broke)"
    if lead["lead"] > 1:
        return text + f": {lead['lead']:.2g}x ahead of the break at {numbers.rps(row['hi_rps'])}"
    if lead["lead"] == 1:
        return text + ": at the break itself, no warning"
    return text + f": only after the break at {numbers.rps(row['hi_rps'])}"


MOVE_THE_KNEE = {
    Label.SEQ_LIMIT: "more sequences (max_num_seqs): the cap is full while KV has headroom",
    Label.KV_PRESSURE: "more KV blocks (memory for the cache), a shorter max_model_len or a smaller KV dtype",
    Label.PREFIX_EVICTION: "more KV blocks, so the shared prefixes stay cached (or routing that keeps a "
                           "conversation on one server)",
    Label.INTERFERENCE: "a smaller prefill chunk budget (max_num_batched_tokens)",
    Label.TOKEN_BUDGET: "a larger per-step token budget (max_num_batched_tokens), if the steps' time allows",
    NoQueueLabel.ITL_BOUND: "more compute or a smaller batch",
    NoQueueLabel.COMPUTE_BOUND: "more compute or a smaller batch",
}


def move_the_knee(row: Mapping[str, Any]) -> str:
    """One line from the knee's label: which knob the limit it names answers to."""
    if row.get("hi_rps") is None:
        return "nothing broke: raise the search's maximum rate to find the knee"
    label = row.get("knee_label")
    if label in MOVE_THE_KNEE:
        return MOVE_THE_KNEE[label]
    if label == Label.FAILED:
        return "the breaking probe failed outright: fix that first (see the stop reason)"
    return "no single limit named at the knee: read the clue"


def _held(r: Mapping[str, Any]) -> str:
    if r.get("lo_rps") is None:
        return DASH
    tok_s = r.get("lo_output_tok_s")
    return numbers.rps(r["lo_rps"]) + ("" if tok_s is None else f" ({numbers.count(round(tok_s))} output tok/s)")


def knee_interval(r: Mapping[str, Any]) -> str:
    """The knee's interval: '29 to 33.8 req/s (90 %)', hi marked when it never showed a verdict."""
    floor, hi = r.get("floor_rps"), r.get("hi_rps")
    if floor is None:
        return DASH
    upper = "no break" if hi is None else f"{hi:,.3g}" + (" (inconclusive)" if r.get("hi_inconclusive") else "")
    conf = r.get("confidence")
    return f"{floor:,.3g} to {upper} req/s" + ("" if not conf else f" ({numbers.share(conf)})")


def drift_text(r: Mapping[str, Any]) -> str:
    """The server's speed on the closed loop after the search against before it."""
    if r.get("drift") is None:
        return DASH
    text = (f"{numbers.change(r['drift'])} ({numbers.rps(r['drift_start_rps'])} before, "
            f"{numbers.rps(r['drift_end_rps'])} after)")
    return ("DRIFTED: " + text + ", measure again on a quiet server") if r.get("drifted") else text


def _stop(r: Mapping[str, Any]) -> str:
    stop = r.get("reason") or DASH
    return f"{stop}: {r['error']}" if r.get("error") else stop


# One setting's line of a frontier's table: (header, cell of a `frontiers` row), in order.
FRONTIER_COLUMNS: list[Column] = [
    ("setting", lambda r: r["setting"]),
    ("highest rate that held", _held),
    ("lowest that broke", lambda r: numbers.rps(r.get("hi_rps"))),
    ("capacity interval", knee_interval),
    ("drift over the search", drift_text),
    ("what filled first at the knee", lambda r: r.get("knee_label") or DASH),
    ("clue", lambda r: r.get("knee_clue") or ""),
    ("leading signal", leading_text),
    ("what would move the knee", move_the_knee),
    ("search stopped", _stop),
]


def frontier_table_html(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows of one frontier, a line per setting."""
    return column_table(FRONTIER_COLUMNS, rows)


# --- what moved the knee --------------------------------------------------------------------------


def relaxation_text(r: Mapping[str, Any]) -> str:
    """'max_num_seqs 8 -> 16', 'KV tokens 20,480 -> 40,960'."""
    return f"{r['knob']} {numbers.count(r.get('relaxed_from'))} -> {numbers.count(r.get('relaxed_to'))}"


def _shift(r: Mapping[str, Any]) -> str:
    shift = r.get("shift")
    if shift is None:
        return DASH
    where = {"up": "above its interval", "down": "below its interval", "no": "within the intervals"}
    if r.get("within_drift"):
        return f"{numbers.change(shift)} (within what the server's drift allows)"
    if r.get("moved") == "no" and r.get("interval_move") in ("up", "down"):
        return f"{numbers.change(shift)} ({where[r['interval_move']]}, less than the least shift that counts)"
    return numbers.change(shift) + (f" ({where[r['moved']]})" if r.get("moved") in where else "")


def least_shift_text(r: Mapping[str, Any]) -> str:
    """'30 %', or '51 % (30 %, widened by the parent's drift of -16 %)'."""
    least, minimum, drift = r.get("least_shift"), r.get("min_shift"), r["_parent"].get("drift")
    if least is None:
        return DASH
    if minimum is None or drift is None or abs(least - minimum) < 0.005:
        return numbers.share(least)
    return (f"{numbers.share(least)} ({numbers.share(minimum)}, widened by the parent's drift of "
            f"{numbers.change(drift)})")


def _role(r: Mapping[str, Any]) -> str:
    return r.get("role") or "no limit named at the knee"


def _verdict(r: Mapping[str, Any]) -> str:
    """The parent's verdict on the relaxed line; on a line with no role, why there is none."""
    parent = r["_parent"]
    if r.get("role") != "relaxed":
        return DASH if r.get("role") else (parent.get("verdict_why") or DASH)
    return f"{parent.get('verdict') or DASH}: {parent.get('verdict_why') or ''}".rstrip(": ")


def moved_rows(rows: Sequence[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], list[Mapping[str, Any]]]]:
    """(a setting of one frontier, its interventions: the relaxed one first), for the
    settings that have interventions."""
    out = []
    for p in rows:
        mine = [r for r in rows if r.get("parent") == p["setting"]]
        if mine:
            out.append((p, sorted(mine, key=lambda r: (r.get("role") != "relaxed", r["setting"]))))
    return out


def moved_table_html(rows: Sequence[Mapping[str, Any]]) -> str:
    """What moved the knee: a line per intervention of each verified setting, with the
    knee before and after, the shift of the highest rate that held, the verdict (on the
    relaxed line) and what filled first at the new knee."""
    lines = [{**r, "_parent": parent} for parent, mine in moved_rows(rows) for r in mine]
    cells: list[Column] = [
        ("setting", lambda r: r["_parent"]["setting"]),
        ("what filled first", lambda r: r["_parent"].get("knee_label") or DASH),
        ("intervention", lambda r: f"{r['setting']}: {relaxation_text(r)}"),
        ("its role", _role),
        ("knee before", lambda r: knee_interval(r["_parent"])),
        ("knee after", knee_interval),
        ("shift of the highest rate held", _shift),
        ("least shift that counts", least_shift_text),
        ("verdict", _verdict),
        ("what filled first at the new knee", lambda r: r.get("knee_label") or DASH),
    ]
    return column_table(cells, lines)


# --- a frontier's knees side by side (a part's `knees`) -------------------------------------------


def knee_shift_table_html(rows: Sequence[Mapping[str, Any]], min_shift: float) -> str:
    """One frontier's searched settings (interventions left out), each knee against the
    first setting's: the ratio of the highest rates held and whether it moved
    (analysis.frontiers.moved: disjoint intervals and a change of at least `min_shift`)."""
    searched = [r for r in rows if not r.get("parent")]
    if not searched:
        return ""
    base = searched[0]

    def against(r: Mapping[str, Any]) -> str:
        if r is base:
            return "the baseline"
        ratio, move = lo_ratio(base.get("lo_rps"), r.get("lo_rps")), moved(base, r, min_shift)
        where = {"up": "moved up", "down": "moved down", "no": "within the noise"}
        return (DASH if ratio is None else f"x{ratio:.2f}") + (f" ({where[move]})" if move in where else "")

    return column_table([
        ("setting", lambda r: r["setting"]),
        ("capacity interval", knee_interval),
        (f"knee against {base['setting']}", against),
        ("what filled first at the knee", lambda r: r.get("knee_label") or DASH),
    ], searched)


def frontier_intro(rows: Sequence[Mapping[str, Any]]) -> str:
    r = rows[0]
    return (f"Workload {r.get('workload') or DASH}; SLO: TTFT <= {r['slo_ttft_ms']:g} ms and no gap between "
            f"tokens over {r['slo_itl_ms']:g} ms for {100 * (r.get('target') or 0):g} % of a probe's requests.")


# --- the chart ------------------------------------------------------------------------------------


def frontier_chart(rows: Sequence[Mapping[str, Any]], points: Sequence[Mapping[str, Any]]) -> alt.LayerChart:
    """Attainment against the probed rate, a line per setting through its measured probes,
    the knee's bracket (lo to hi) shaded in the setting's colour, the target as a dashed
    rule; probes with failures in red, a probe that failed outright as a red cross at 0."""
    target = next((r.get("target") for r in rows if r.get("target") is not None), None)
    data = pl.DataFrame(
        [{"setting": p["setting"], "probe": p["probe"], "rate": p["rate"],
          "attainment": None if p["attainment"] is None else 100 * p["attainment"],
          "shown": 0.0 if p["attainment"] is None else 100 * p["attainment"],
          "verdict": ("failed: " + (p.get("error") or p.get("status") or "no verdict")) if p["outright"]
          else ("held" if p["held"] else "broke"),
          "failed": p["n_failed"], "bad": p["failed"], "outright": p["outright"], "run": p["run_id"]}
         for p in points],
        schema={"setting": pl.String, "probe": pl.Int64, "rate": pl.Float64, "attainment": pl.Float64,
                "shown": pl.Float64, "verdict": pl.String, "failed": pl.Int64, "bad": pl.Boolean,
                "outright": pl.Boolean, "run": pl.String},
    ).sort("setting", "rate")
    x_title = "offered rate (requests/s, log)"
    x = alt.X("rate:Q", title=x_title, scale=alt.Scale(type="log", nice=False))
    y = alt.Y("shown:Q", title="attainment (% of requests meeting the SLO)", scale=alt.Scale(domain=[0, 100]))
    color = alt.Color("setting:N", title="setting")
    tooltip = ["setting:N", "probe:Q", alt.Tooltip("rate:Q", format=".3g"),
               alt.Tooltip("attainment:Q", format=".1f", title="attainment %"), "verdict:N",
               alt.Tooltip("failed:Q", title="failed requests"), "run:N"]
    measured = data.filter(~pl.col("outright"))
    layers: list[alt.TopLevelMixin] = []
    # An empty layer draws nothing but warns in the browser's console: only layers with data.
    brackets = pl.DataFrame(
        [{"setting": r["setting"], "lo": r["lo_rps"], "hi": r["hi_rps"]} for r in rows
         if r.get("lo_rps") is not None and r.get("hi_rps") is not None],
        schema={"setting": pl.String, "lo": pl.Float64, "hi": pl.Float64},
    )
    if brackets.height:
        layers.append(alt.Chart(brackets).mark_rect(opacity=0.15).encode(
            x=alt.X("lo:Q", title=x_title, scale=alt.Scale(type="log", nice=False)), x2="hi:Q", color=color,
            tooltip=["setting:N", alt.Tooltip("lo:Q", title="knee: held at", format=".3g"),
                     alt.Tooltip("hi:Q", title="knee: broke at", format=".3g")]))
    edges = pl.DataFrame(
        [{"setting": r["setting"], "rate": v, "edge": edge} for r in rows
         for edge, v in (("held at", r.get("lo_rps")), ("broke at", r.get("hi_rps"))) if v is not None],
        schema={"setting": pl.String, "rate": pl.Float64, "edge": pl.String},
    )
    if edges.height:
        layers.append(alt.Chart(edges).mark_rule(strokeDash=[2, 2], strokeWidth=1.5).encode(
            x=x, color=color, tooltip=["setting:N", "edge:N", alt.Tooltip("rate:Q", format=".3g")]))
    if target is not None:
        layers.append(alt.Chart(pl.DataFrame({"target": [100 * target]})).mark_rule(
            color="gray", strokeDash=[6, 3]).encode(y="target:Q"))
    if measured.height:
        base = alt.Chart(measured)
        layers.append(base.mark_line().encode(x=x, y=y, color=color, detail="setting:N"))
        layers.append(base.mark_circle(size=70, opacity=1).encode(
            x=x, y=y, tooltip=tooltip,
            color=alt.condition(alt.datum.bad, alt.value(charts.FAILED_COLOR), color)))
    outright = data.filter(pl.col("outright"))
    if outright.height:
        layers.append(alt.Chart(outright).mark_point(shape="cross", size=140, filled=True,
                                                     color=charts.FAILED_COLOR).encode(x=x, y=y, tooltip=tooltip))
    n_bad = int(data["bad"].sum())
    subtitle = ("shaded: the knee (highest rate that held to lowest that broke); dashed gray: the target; "
                + (f"red: {n_bad} probe(s) with failures (a cross at 0: failed outright)" if n_bad
                   else "no probe had failures"))
    return alt.layer(*layers).properties(
        width=charts.WIDTH, height=260,
        title=alt.TitleParams(f"Attainment against offered rate: {rows[0]['frontier']}", subtitle=subtitle,
                              anchor="start", fontSize=12),
    )


def by_frontier(rows: Sequence[Mapping[str, Any]],
                points: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[dict], list[dict]]]:
    """(frontier, its rows, its probes), frontiers in name order; a frontier probed but not
    yet in table `frontiers` (the database not diagnosed) comes with no rows."""
    names = sorted({r["frontier"] for r in rows} | {p["frontier"] for p in points})
    return [(n, [dict(r) for r in rows if r["frontier"] == n], [dict(p) for p in points if p["frontier"] == n])
            for n in names]


def by_setting(rows: Sequence[Mapping[str, Any]],
               points: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[dict]]]:
    """(setting, its probes in probe order) of one frontier: the settings of its table
    first, in its order, then any probed setting the table lacks."""
    settings = dict.fromkeys([*(r["setting"] for r in rows), *(p["setting"] for p in points)])
    return [(s, sorted((dict(p) for p in points if p["setting"] == s), key=lambda p: p["probe"])) for s in settings]


# --- one search's probes -------------------------------------------------------------------------


def probe_verdict(p: Mapping[str, Any]) -> str:
    if p["outright"]:
        return "failed: " + (p.get("error") or p.get("status") or "no verdict")
    # the probe's own verdict (a rate is judged by its probes pooled); older probes have only `held`
    return p.get("verdict") or {True: "held", False: "broke"}.get(p["held"], "no verdict")


def _interval(p: Mapping[str, Any]) -> str:
    lo, hi = p.get("attainment_lo"), p.get("attainment_hi")
    return DASH if lo is None or hi is None else f"{100 * lo:.1f} to {100 * hi:.1f} %"


def _growth(p: Mapping[str, Any]) -> str:
    g = p.get("backlog_growth")
    return DASH if g is None else f"{g:+.3f} s/s"


def _missed(key: str) -> Callable[[Mapping[str, Any]], str]:
    return lambda p: numbers.count((p.get("missed") or {}).get(key))


def _attainment(p: Mapping[str, Any]) -> str:
    # one decimal: a whole percentage would round 94.6 % up to a 95 % target
    return DASH if p["attainment"] is None else f"{100 * p['attainment']:.1f} %"


# A probe's line (a `probe_points` row with its run's diagnosis label as `label`).
PROBE_COLUMNS: list[Column] = [
    ("probe", lambda p: p["probe"]),
    ("rate", lambda p: numbers.rps(p["rate"])),
    ("length", lambda p: numbers.seconds(p.get("probe_s"))),
    ("requests", lambda p: numbers.count(p.get("requests"))),
    ("attainment", _attainment),
    ("its interval", _interval),
    ("backlog growth", _growth),
    ("verdict", probe_verdict),
    ("lifetime p90", lambda p: numbers.seconds(p.get("lifetime_p90_s"))),
    ("what filled first (its diagnosis)", lambda p: p.get("label") or DASH),
    ("failed", _missed("failed")),
    ("over the TTFT SLO", _missed("ttft")),
    ("over the ITL SLO", _missed("itl")),
    ("run", lambda p: p["run_id"]),
]


def probe_table_html(points: Sequence[Mapping[str, Any]], labels: Mapping[str, str]) -> str:
    """One search's probes, a line each (`labels`: the diagnosis' label per run id)."""
    return column_table(PROBE_COLUMNS, [{**p, "label": labels.get(p["run_id"])} for p in points])


def probes_summary(setting: str, points: Sequence[Mapping[str, Any]]) -> str:
    """The folded block's one line: the setting, how many probes, the rates they spanned."""
    rates = [p["rate"] for p in points]
    span = f", {numbers.rps(min(rates))} to {numbers.rps(max(rates))}" if len(set(rates)) > 1 else ""
    return f"{setting}: its {len(points)} probe{'s' if len(points) != 1 else ''}{span}"


# --- the one-screen summary ---------------------------------------------------------------------


def key_number(d: Mapping[str, Any], rules: DiagnosisRules) -> str:
    """The one number that shows a run's label."""
    label = d.get("label")
    # where the server timed its requests, a limit's label also rests on its queue
    queue = f", vLLM's queue {numbers.share(d.get('window_queue_share'))} of TTFT" if d.get("window_timed") else ""
    if label == Label.SEQ_LIMIT:
        return f"running at the cap {numbers.share(d.get('running_at_cap_share'))} of the time{queue}"
    if label == Label.KV_PRESSURE:
        return f"KV >= {rules.kv_full_pct:g} % for {numbers.share(d.get('kv_full_share'))} of the time{queue}"
    if label == Label.PREFIX_EVICTION:
        return (f"cache hits {numbers.share(d.get('measured_hit_share'))} of prompt tokens against "
                f"{numbers.share(d.get('ideal_hit_share'))} offered, KV >= {rules.kv_full_pct:g} % for "
                f"{numbers.share(d.get('kv_full_share'))} of the time{queue}")
    if label == Label.INTERFERENCE:
        ratio, unqueued = d.get("interference_ratio"), d.get("interference_prefill_ratio")
        outside = "" if unqueued is None else f" ({unqueued:.1f}x outside vLLM's queue)"
        return "n/a" if ratio is None else f"TTFT p90 {ratio:.1f}x higher behind a long prompt{outside}"
    if label == Label.TOKEN_BUDGET:
        return (f"steps used {numbers.share(d.get('budget_fill'))} of the token budget ({d.get('token_budget')}) "
                f"while requests waited{queue}")
    if label == Label.REFERENCE:
        return f"waiting {numbers.share(d.get('waiting_share'))} of the time"
    if label == Label.FAILED:
        return "nothing measured"
    cov = d.get("scrape_coverage")
    if cov is not None and cov < rules.min_scrape_coverage:
        return f"scrapes cover {numbers.share(cov)} of the loaded window"
    return "no rule matched"


def summary_rows(diagnosis: Sequence[Mapping[str, Any]], metas: Mapping[str, RunMeta],
                 frontiers: Sequence[Mapping[str, Any]], rules: DiagnosisRules,
                 parts: Sequence[str] = ()) -> list[dict[str, str]]:
    """Designed experiments (not the probes) grouped by their part in the study's order
    (`parts`: the names, in order; others after them), then one line per (frontier,
    setting). Each: part, what, designed, found (what filled first, and where a second
    limit filled too, that one with its time), number, mark ("differs" when a designed
    pattern was not what was found first)."""
    order = {p: i for i, p in enumerate(parts)}
    part = {run_id: m.part for run_id, m in metas.items()}
    designed = [d for d in diagnosis if not (d["run_id"] in metas and metas[d["run_id"]].frontier)]
    designed.sort(key=lambda d: order.get(part.get(d["run_id"]), len(order)))  # stable
    out = []
    for d in designed:
        expect, label = d.get("expect"), d.get("label") or Label.UNCLASSIFIED
        # where two limits filled, what filled next too (the label is the first)
        found = f"{label}, then {d['then_filled']}" if d.get("then_filled") else label
        out.append({"part": part.get(d["run_id"]) or DASH, "what": d["experiment"],
                    "designed": expect or DASH, "found": found, "number": key_number(d, rules),
                    "mark": "" if not expect else ("as designed" if expect == label else "DIFFERS")})
    for r in frontiers:
        if r.get("parent"):
            continue  # an intervention: its parent's line gives the verdict
        if r.get("hi_rps") is None:
            number = f"held up to {numbers.rps(r.get('lo_rps'))}, never broke"
        else:
            number = f"held {numbers.rps(r.get('lo_rps'))}, broke at {numbers.rps(r['hi_rps'])}"
        if r.get("floor_rps") is not None:
            number += f"; capacity {knee_interval(r)}"
        if r.get("drift") is not None:
            number += f"; drift {numbers.change(r['drift'])}" + (" (DRIFTED)" if r.get("drifted") else "")
        found = r.get("knee_label") or DASH
        if r.get("verdict"):
            found += f" ({r['verdict']} by intervention" + (
                f"; next: {r['next_label']})" if r.get("next_label") else ")")
        out.append({"part": f"frontier {r['frontier']}", "what": r["setting"], "designed": DASH,
                    "found": found, "number": number, "mark": ""})
    return out


def summary_table(rows: Sequence[Mapping[str, str]]) -> str:
    """A small table; a part's name only on its first line, a difference in bold."""
    body, last = [], None
    for r in rows:
        part = r["part"] if r["part"] != last else ""
        last = r["part"]
        body.append([part, r["what"], r["designed"], r["found"], r["number"], r["mark"]])
    html = html_table(["part", "run", "designed for", "what filled first", "the number that shows it", ""], body)
    # the one mark that must catch the eye; `esc` makes the cell text, so the literal is safe
    return html.replace(f"<td>{esc('DIFFERS')}</td>", "<td><strong>differs</strong></td>")
