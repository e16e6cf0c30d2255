"""The comparison as one HTML page that works offline (the report's Vega bundle and
style): the verdict counts and the gate's reasons first, then what differs in the setup,
the knees (a table and a chart of both intervals), the runs (what filled first, then each
figure with its interval and verdict, failures among them) and what is on one side only."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import altair as alt
import polars as pl

from filledfirst.analysis import numbers
from filledfirst.analysis.numbers import DASH
from filledfirst.compare import Comparison
from filledfirst.compare.verdicts import Change
from filledfirst.report import charts, markup

_BASE, _CAND = "baseline", "candidate"


def _h(level: int, text: str) -> str:
    return f"<h{level}>{markup.esc(text)}</h{level}>"


def _knee(lo: float | None, floor: float | None, hi: float | None) -> str:
    if lo is None and hi is None:
        return DASH
    held = DASH if lo is None else f"{lo:,.3g}"
    span = "" if floor is None else f" ({floor:,.3g} to {'no break' if hi is None else f'{hi:,.3g}'})"
    return f"{held} req/s{span}"


def _label_pair(a: str | None, b: str | None, changed: bool | None) -> str:
    text = f"{a or DASH} / {b or DASH}"
    return f"CHANGED: {text}" if changed else text


def summary(c: Comparison, reasons: Sequence[str]) -> str:
    counts = c.verdicts
    n = sum(counts.values())
    parts = [f"{v} {k}" for k, v in counts.items() if v]
    out = [markup.para(f"Compared {len(c.knees)} knees and {len(c.runs)} run figures "
                       f"({len(c.labels)} runs): " + (", ".join(parts) if n else "nothing to compare") + ".")]
    if reasons:
        items = "".join(f"<li>{markup.esc(r)}</li>" for r in reasons)
        out.append(f"<p><strong>The gate fails</strong> ({len(reasons)} reasons):</p><ul>{items}</ul>")
    else:
        out.append(markup.para("The gate passes: no knee dropped beyond its threshold and no label changed."))
    out += [markup.para(f"Warning: {w}") for w in c.warnings]
    return "".join(out)


def setup_html(c: Comparison) -> str:
    if not c.setup:
        return markup.para("Nothing differs in the recorded setup (model, versions, hardware, each matched "
                           "experiment's server settings and spec).")
    return markup.html_table(["", _BASE, _CAND], ((r["key"], r["base"], r["candidate"]) for r in c.setup))


KNEE_COLUMNS: list[markup.Column[dict[str, Any]]] = [
    ("search", lambda r: f"{r['frontier']}/{r['setting']}"),
    (f"{_BASE} knee (interval)", lambda r: _knee(r["base_lo_rps"], r["base_floor_rps"], r["base_hi_rps"])),
    (f"{_CAND} knee (interval)", lambda r: _knee(r["cand_lo_rps"], r["cand_floor_rps"], r["cand_hi_rps"])),
    ("shift", lambda r: numbers.change(r["shift"])),
    ("least that counts", lambda r: numbers.change(r["min_shift"])),
    ("verdict", lambda r: r["verdict"]),
    ("what filled first at the knee", lambda r: _label_pair(r["base_label"], r["cand_label"], r["label_changed"])),
    ("drift over each search", lambda r: f"{numbers.change(r['base_drift'])} / {numbers.change(r['cand_drift'])}"),
]


def knee_chart(rows: Sequence[Mapping[str, Any]]) -> alt.LayerChart:
    """Each side's knee interval (a bar from its floor to its hi; an arrow's worth past the
    highest rate held when nothing broke) and the highest rate held (a tick)."""
    data = []
    for r in rows:
        for side, p in ((_BASE, "base"), (_CAND, "cand")):
            lo, floor, hi = r[f"{p}_lo_rps"], r[f"{p}_floor_rps"], r[f"{p}_hi_rps"]
            if lo is None and floor is None:
                continue
            data.append({"search": f"{r['frontier']}/{r['setting']}", "side": side, "lo": lo,
                         "floor": floor, "hi": hi if hi is not None else (lo or floor) * 1.5,
                         "verdict": r["verdict"]})
    df = pl.DataFrame(data, schema={"search": pl.String, "side": pl.String, "lo": pl.Float64,
                                    "floor": pl.Float64, "hi": pl.Float64, "verdict": pl.String})
    base = alt.Chart(df).encode(y=alt.Y("side:N", title=None), color=alt.Color("side:N", title=None))
    bars = base.mark_rule(strokeWidth=6, opacity=0.5).encode(
        x=alt.X("floor:Q", title="knee: highest rate held (tick) and interval (bar), req/s"), x2="hi:Q",
        tooltip=["search:N", "side:N", alt.Tooltip("lo:Q", format=".3g"), alt.Tooltip("floor:Q", format=".3g"),
                 alt.Tooltip("hi:Q", format=".3g"), "verdict:N"])
    ticks = base.mark_tick(thickness=3, size=22).encode(x="lo:Q")
    return alt.layer(bars, ticks, data=df).properties(width=charts.WIDTH - 120, height=50).facet(
        row=alt.Row("search:N", title=None, header=alt.Header(labelAngle=0, labelAlign="left"))).properties(
        title="Knees on each side")


def _value(x: float | None, unit: str) -> str:
    if x is None:
        return DASH
    if unit == "ms":
        return numbers.ms(x)
    if unit == "share":
        return f"{100 * x:.1f} %"
    return numbers.rps(x)


def _change(r: Mapping[str, Any]) -> str:
    if r["change"] is None:
        return DASH
    if r["by"] == "difference":
        scale, unit = (100, " points") if r["unit"] == "share" else (1, f" {r['unit']}")
        fmt = lambda x: f"{scale * x:+.3g}{unit}"  # noqa: E731
    else:
        fmt = numbers.change
    interval = "" if r["change_low"] is None else f" ({fmt(r['change_low'])} to {fmt(r['change_high'])})"
    return fmt(r["change"]) + interval


RUN_COLUMNS: list[markup.Column[dict[str, Any]]] = [
    ("experiment", lambda r: r["experiment"]),
    ("figure", lambda r: r["figure"]),
    (_BASE, lambda r: _value(r["base"], r["unit"])),
    (_CAND, lambda r: _value(r["candidate"], r["unit"])),
    ("change (interval)", _change),
    ("least that counts", lambda r: numbers.change(r["min_change"])),
    ("verdict", lambda r: r["verdict"] + ("" if r["verdict"] not in (Change.HIGHER, Change.LOWER) else
                                          " (better)" if r["verdict"] == r["better"] else " (worse)")),
    ("requests", lambda r: f"{r['n_base']:,} / {r['n_cand']:,}"),
]

LABEL_COLUMNS: list[markup.Column[dict[str, Any]]] = [
    ("experiment", lambda r: r["experiment"]),
    ("status", lambda r: f"{r['base_status']} / {r['cand_status']}"),
    ("designed for", lambda r: r["expect"] or DASH),
    ("offered", lambda r: f"{numbers.rps(r['base_offered_rps'])} / {numbers.rps(r['cand_offered_rps'])}"),
    ("drift of its server", lambda r: f"{numbers.change(r['base_drift'])} / {numbers.change(r['cand_drift'])}"),
    ("what filled first", lambda r: _label_pair(r["base_label"], r["cand_label"], r["label_changed"])),
]


def change_chart(rows: Sequence[Mapping[str, Any]]) -> alt.LayerChart:
    """Each ratio figure's change with its interval, per run: the band is what noise allows."""
    data = [{"run": r["experiment"], "figure": r["figure"], "change": 100 * r["change"],
             "low": 100 * r["change_low"], "high": 100 * r["change_high"], "verdict": r["verdict"]}
            for r in rows if r["by"] == "ratio" and r["change"] is not None and r["change_low"] is not None]
    df = pl.DataFrame(data, schema={"run": pl.String, "figure": pl.String, "change": pl.Float64,
                                    "low": pl.Float64, "high": pl.Float64, "verdict": pl.String})
    base = alt.Chart(df).encode(y=alt.Y("run:N", title=None), color=alt.Color("verdict:N"))
    rules = base.mark_rule(strokeWidth=3).encode(x=alt.X("low:Q", title="change, % (interval)"), x2="high:Q")
    points = base.mark_point(filled=True, size=50).encode(
        x="change:Q", tooltip=["run:N", "figure:N", alt.Tooltip("change:Q", format="+.0f"), "verdict:N"])
    zero = alt.Chart(pl.DataFrame({"x": [0.0]})).mark_rule(color="gray", strokeDash=[4, 3]).encode(x="x:Q")
    title = "Change of each run's figures (candidate / baseline)"
    return alt.layer(zero, rules, points, data=df).properties(width=160, height=alt.Step(14)).facet(
        column=alt.Column("figure:N", title=None)).properties(title=title)


def page_html(c: Comparison, reasons: Sequence[str], title: str | None = None) -> str:
    title = title or f"Comparison: {c.shown(c.candidate)} against {c.shown(c.base)}"
    body = [charts.vega_bundle_html(), markup.style_html(), _h(1, title),
            markup.para(f"Baseline: {c.shown(c.base)}. Candidate: {c.shown(c.candidate)}. A knee changed when the "
                        f"two intervals do not overlap and its highest rate held moved by at least "
                        f"{c.rules.knee_min_shift:.0%}, widened by each search's drift; a run's figure changed "
                        f"when its {c.rules.confidence:.0%} bootstrap interval over requests excludes no change and it "
                        f"moved by at least {c.rules.run_min_change:.0%}, widened by the drift of the search whose "
                        f"server it ran on, if any (a share: its interval alone)."),
            summary(c, reasons), _h(2, "What differs in the setup"), setup_html(c), _h(2, "Knees")]
    if c.knees:
        body += [markup.column_table(KNEE_COLUMNS, c.knees), charts.embed(knee_chart(c.knees))]
    else:
        body.append(markup.para("No capacity search is on both sides."))
    body.append(_h(2, "Runs"))
    if c.labels:
        body += [markup.column_table(LABEL_COLUMNS, c.labels), markup.column_table(RUN_COLUMNS, c.runs)]
        if any(r["by"] == "ratio" and r["change_low"] is not None for r in c.runs):
            body.append(charts.embed(change_chart(c.runs)))
    else:
        body.append(markup.para("No experiment is on both sides."))
    body.append(_h(2, "On one side only"))
    if c.one_side:
        body.append(markup.html_table(["kind", "name", "only in"],
                                      ((r["kind"], r["name"], r["side"]) for r in c.one_side)))
    else:
        body.append(markup.para("Nothing: every search and experiment is on both sides."))
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
            f"<body>{''.join(body)}</body></html>")
