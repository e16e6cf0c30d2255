"""Altair charts for the report, embedded so they draw with no network.

Altair's own HTML output loads Vega from a CDN, and Quarto's embed-resources cannot
inline what that loader fetches later. So the page carries vl_convert's Vega bundle once
(`vega_bundle_html`) and each chart is a div plus a `vegaEmbed` call (`embed`).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Sequence
from typing import Any

import altair as alt
import polars as pl
import vl_convert

from filledfirst.contracts.diagnosis import DiagnosisRow
from filledfirst.contracts.scheduler import Constraint
from filledfirst.report.rows import RunRates, SweepLine, TtftPart

WIDTH = 640
_ids = itertools.count(1)
FAILED_COLOR = "#d62728"


def _vl_version() -> str | None:
    """The bundle's Vega-Lite must understand Altair's spec; pick Altair's if offered."""
    major_minor = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    return major_minor if major_minor in vl_convert.get_vegalite_versions() else None


_SCRIPT_END = re.compile(r"</(script)", re.I)


def _script_safe(code: str) -> str:
    """Code inside <script> must not close it early. Only `</script` is rewritten (to
    `<\\/script`, same meaning inside a JS string): a blanket `</` rewrite would break
    regex literals such as `/</g` in the bundle."""
    return _SCRIPT_END.sub(r"<\\/\1", code)


def _json_for_script(obj: Any) -> str:
    # \u escapes keep data strings (run errors, roles) from ever forming markup.
    s = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def vega_bundle_html() -> str:
    """Once per page, before any chart: defines window.vegaEmbed (about 0.9 MB)."""
    bundle = vl_convert.javascript_bundle(vl_version=_vl_version())
    return f"<script>{_script_safe(bundle)}</script>"


def embed(chart: alt.TopLevelMixin, div_id: str | None = None) -> str:
    """A div and the script that draws `chart` into it as SVG."""
    div_id = div_id or f"ff-chart-{next(_ids)}"
    # Whole runs exceed Altair's 5,000-row guard; the data must be inline to stay offline.
    with alt.data_transformers.disable_max_rows():
        spec = chart.to_dict()
    opts = {"renderer": "svg", "actions": False}
    return (
        f'<div id="{div_id}" class="ff-chart"></div>\n<script>'
        f'vegaEmbed("#{div_id}", {_json_for_script(spec)}, {_json_for_script(opts)})'
        f'.catch(function (e) {{ document.getElementById("{div_id}").textContent = '
        f'"chart failed to draw: " + e; }});</script>'
    )


def _x(title: bool) -> alt.X:
    return alt.X("t:Q", title="seconds since run start" if title else None)


def ttft_panel(points: pl.DataFrame) -> alt.LayerChart:
    """TTFT per ok request by arrival time, roles coloured; failed requests as red rules."""
    ok = points.filter(pl.col("ttft_ms").is_not_null() & (pl.col("ttft_ms") > 0))
    failed = points.filter(pl.col("status") != "ok")
    n_failed = failed.height
    dots = (
        alt.Chart(ok.rename({"t_scheduled": "t"}))
        .mark_circle(size=28, opacity=0.75)
        .encode(
            x=_x(False),
            y=alt.Y("ttft_ms:Q", title="TTFT (ms, log)", scale=alt.Scale(type="log", padding=6)),
            color=alt.Color("role:N", title="role"),
            tooltip=["request_id:Q", "role:N", alt.Tooltip("t:Q", format=".2f"),
                     alt.Tooltip("ttft_ms:Q", format=",.1f")],
        )
    )
    # Failed requests have no TTFT; a rule at their arrival keeps them in sight whatever
    # the y scale does.
    rules = (
        alt.Chart(failed.rename({"t_scheduled": "t"}))
        .mark_rule(color=FAILED_COLOR, strokeDash=[4, 3], strokeWidth=1.5)
        .encode(x=_x(False), tooltip=["request_id:Q", "role:N", "status:N", "error:N",
                                      alt.Tooltip("t:Q", format=".2f")])
    )
    subtitle = (
        f"red dashed lines: {n_failed} failed request(s) at their arrival time"
        if n_failed else "no failed requests"
    )
    # An empty layer would draw nothing but warn in the browser's console.
    layers = [dots, rules] if n_failed else [dots]
    return alt.layer(*layers).properties(
        width=WIDTH, height=180,
        title=alt.TitleParams("TTFT per request, by arrival time", subtitle=subtitle,
                              anchor="start", fontSize=12),
    )


def _signal_line(series: pl.DataFrame, signal: str, title: str, last: bool) -> alt.Chart:
    return (
        alt.Chart(series)
        .transform_filter(alt.datum.signal == signal)
        .mark_line(interpolate="step-after")
        .encode(x=_x(last), y=alt.Y("value:Q", title=title),
                tooltip=[alt.Tooltip("t:Q", format=".2f"), alt.Tooltip("value:Q", format=",.1f")])
        .properties(width=WIDTH, height=90)
    )


def running_panel(series: pl.DataFrame, max_num_seqs: int | None) -> alt.TopLevelMixin:
    line = _signal_line(series, "running", "running", last=False)
    if max_num_seqs is None:
        return line
    cap = pl.DataFrame({"cap": [max_num_seqs], "label": [f"max_num_seqs {max_num_seqs}"]})
    base = alt.Chart(cap)
    rule = base.mark_rule(color="black", strokeDash=[6, 3]).encode(y="cap:Q")
    label = base.mark_text(align="left", dx=4, dy=-6, fontSize=10).encode(
        y="cap:Q", x=alt.value(0), text="label:N"
    )
    # The cap is drawn even when running stays far below it: the gap is the finding.
    return alt.layer(line, rule, label)


def held_panel(held: pl.DataFrame) -> alt.Chart:
    """The requests waiting at each scrape, coloured by what held the head of the queue
    (filledfirst.analysis.diagnosis.scheduler)."""
    order = [str(c) for c in Constraint]
    return (
        alt.Chart(held)
        .mark_bar()
        .encode(x=_x(False), y=alt.Y("waiting:Q", title="waiting, held by", stack=True),
                color=alt.Color("constraint:N", title="held by", scale=alt.Scale(domain=order)),
                tooltip=[alt.Tooltip("t:Q", format=".2f"), "constraint:N", alt.Tooltip("waiting:Q", format=",.0f")])
        .properties(width=WIDTH, height=90)
    )


def run_chart(points: pl.DataFrame, series: pl.DataFrame, max_num_seqs: int | None,
              held: pl.DataFrame | None = None) -> alt.VConcatChart:
    """TTFT above running / waiting (and what held it, where a scrape saw a queue) / KV %,
    all on one time axis."""
    kv = _signal_line(series, "kv_pct", "KV %", last=True).encode(
        y=alt.Y("value:Q", title="KV %", scale=alt.Scale(domain=[0, 100]))
    )
    waiting = (_signal_line(series, "waiting", "waiting", last=False) if held is None or held.is_empty()
               else held_panel(held))
    return alt.vconcat(
        ttft_panel(points),
        running_panel(series, max_num_seqs),
        waiting,
        kv,
        spacing=8,
    ).resolve_scale(x="shared", color="independent")


def sweep_chart(rows: Sequence[SweepLine]) -> alt.HConcatChart:
    """Seed 001's sweep: TTFT p50 and p95 against concurrency, and total tokens/s, a line
    per sweep (dashed apart). Failed requests show as a count in the tooltip and mark their
    level in red."""
    data = pl.DataFrame(
        [{"sweep": r.sweep, "concurrency": r.concurrency, "failed": r.run.n_failed,
          "TTFT p50": r.run.ttft_p50_ms, "TTFT p95": r.rates.ttft_p95_ms, "total tok/s": r.rates.total_tok_s}
         for r in rows],
        schema={"sweep": pl.String, "concurrency": pl.Int64, "failed": pl.Int64, "TTFT p50": pl.Float64,
                "TTFT p95": pl.Float64, "total tok/s": pl.Float64},
    )
    x = alt.X("concurrency:Q", scale=alt.Scale(type="log", base=2), title="concurrency (workers)")
    point_color = alt.condition(alt.datum.failed > 0, alt.value(FAILED_COLOR), alt.value("black"))
    ttft = (
        alt.Chart(data)
        .transform_fold(["TTFT p50", "TTFT p95"], as_=["stat", "ms"])
        .mark_line(point=True)
        .encode(x=x, y=alt.Y("ms:Q", title="TTFT (ms, log)", scale=alt.Scale(type="log")),
                color=alt.Color("stat:N", title=None), strokeDash=alt.StrokeDash("sweep:N"),
                tooltip=["sweep:N", "concurrency:Q", "stat:N", "ms:Q", "failed:Q"])
        .properties(width=300, height=200, title="TTFT against concurrency")
    )
    tput = (
        alt.Chart(data)
        .mark_line(point=True)
        .encode(x=x, y=alt.Y("total tok/s:Q"), strokeDash=alt.StrokeDash("sweep:N"),
                tooltip=["sweep:N", "concurrency:Q", "total tok/s:Q", "failed:Q"])
        .properties(width=300, height=200, title="total output tokens/s")
    )
    if data["failed"].sum() == 0:
        return alt.hconcat(ttft, tput)
    failed = alt.Chart(data).transform_filter(alt.datum.failed > 0).mark_point(size=90, shape="cross").encode(
        x=x, y="total tok/s:Q", color=point_color)
    return alt.hconcat(ttft, alt.layer(tput, failed))


def goodput_chart(rows: Sequence[tuple[DiagnosisRow, RunRates]]) -> alt.LayerChart:
    """Goodput against offered load, one point per open-loop run (its diagnosis and its
    rates); the diagonal is "every request met the SLO". Runs with failed requests are drawn
    red (they count as missed)."""
    data = pl.DataFrame(
        [{"run": d.experiment, "offered": r.offered_rps, "goodput": d.goodput_rps,
          "failed": r.n_failed, "met": 100 * (d.slo_met_share or 0)} for d, r in rows],
        schema={"run": pl.String, "offered": pl.Float64, "goodput": pl.Float64,
                "failed": pl.Int64, "met": pl.Float64},
    )
    top = max([*data["offered"].drop_nulls().to_list(), *data["goodput"].drop_nulls().to_list(), 1.0])
    diagonal = alt.Chart(pl.DataFrame({"x": [0.0, top], "y": [0.0, top]})).mark_line(
        strokeDash=[4, 3], color="gray").encode(x="x:Q", y="y:Q")
    color = alt.condition(alt.datum.failed > 0, alt.value(FAILED_COLOR), alt.value("steelblue"))
    points = alt.Chart(data).mark_circle(size=70).encode(
        x=alt.X("offered:Q", title="offered load (requests/s)"),
        y=alt.Y("goodput:Q", title="goodput (requests/s meeting the SLO)"),
        color=color,
        tooltip=["run:N", alt.Tooltip("offered:Q", format=".2f"), alt.Tooltip("goodput:Q", format=".2f"),
                 alt.Tooltip("met:Q", format=".0f", title="% met"), "failed:Q"],
    )
    labels = points.mark_text(align="left", dx=6, fontSize=10).encode(text="run:N", color=alt.value("black"))
    return alt.layer(diagonal, points, labels).properties(
        width=WIDTH, height=260, title="Goodput against offered load (open loop; red: runs with failed requests)")


def ttft_parts_chart(rows: Sequence[TtftPart]) -> alt.Chart:
    """One run's TTFT split along the request path (request_path.TTFT_PARTS), a stacked bar
    per role and quantile: the mean parts of the requests around that TTFT quantile, which
    add up to their mean TTFT. `rows`: request_path.ttft_parts, roles without timings left
    out by the caller."""
    from filledfirst.analysis.request_path import BAND, TTFT_PARTS

    names = [name for _, name in TTFT_PARTS]
    data = pl.DataFrame(
        [{"bar": f"{r.role} p{round((r.q or 0) * 100)}", "part": name, "order": k, "ms": getattr(r, col),
          "ttft": r.ttft_ms, "requests": r.n_band}
         for r in rows if r.n_timed for k, (col, name) in enumerate(TTFT_PARTS)],
        schema={"bar": pl.String, "part": pl.String, "order": pl.Int64, "ms": pl.Float64, "ttft": pl.Float64,
                "requests": pl.Int64},
    )
    return (
        alt.Chart(data)
        .mark_bar()
        .encode(
            x=alt.X("sum(ms):Q", title="ms (mean of the requests around the quantile)"),
            y=alt.Y("bar:N", title=None, sort=None),
            color=alt.Color("part:N", title="part", scale=alt.Scale(domain=names), sort=names),
            order=alt.Order("order:Q"),
            tooltip=["bar:N", "part:N", alt.Tooltip("ms:Q", format=",.1f"),
                     alt.Tooltip("ttft:Q", format=",.1f", title="their TTFT (ms)"), "requests:Q"],
        )
        .properties(
            width=WIDTH, height=alt.Step(22),
            title=alt.TitleParams(
                "Where TTFT went, around its p50 and p90",
                subtitle=f"the requests within {BAND * 100:g} quantile points of each; server parts from vLLM's "
                         "per-request timings",
                anchor="start", fontSize=12),
        )
    )


def prefix_cache_chart(shares: pl.DataFrame, unreported: int) -> alt.Chart:
    """One run's prefix cache over its time: the share of prompt tokens an unbounded cache
    would have served against what was served, by the answers and by the server's counters.
    `shares`: analysis.prefix_cache.over_time; `unreported`: requests sent that reported no
    cached tokens (failed ones among them), left out of every share and said so."""
    from filledfirst.analysis.prefix_cache import ANSWERS, IDEAL, SERVER

    order = [IDEAL, ANSWERS, SERVER]
    subtitle = "share of prompt tokens, by arrival time (the server's by scrape time)"
    if unreported:
        subtitle += f"; {unreported} sent request(s) reported nothing (failed or cut short) and are left out"
    return (
        alt.Chart(shares)
        .mark_line(point=True)
        .encode(
            x=alt.X("t:Q", title="run time (s)"),
            y=alt.Y("share:Q", title="prompt tokens served from cache", axis=alt.Axis(format="%"),
                    scale=alt.Scale(domain=[0, 1])),
            color=alt.Color("series:N", title=None, scale=alt.Scale(domain=order), sort=order),
            strokeDash=alt.StrokeDash("series:N", legend=None,
                                      scale=alt.Scale(domain=order, range=[[6, 3], [1, 0], [2, 2]])),
            tooltip=["series:N", alt.Tooltip("t:Q", format=".1f"), alt.Tooltip("share:Q", format=".1%"),
                     alt.Tooltip("n:Q", title="requests")],
        )
        .properties(width=WIDTH, height=160,
                    title=alt.TitleParams("Prefix cache: the reuse offered against the reuse delivered",
                                          subtitle=subtitle, anchor="start", fontSize=12))
    )


def step_time_chart(points: pl.DataFrame) -> alt.LayerChart:
    """Each interval's measured step against the step its setting's model gives, on the
    diagonal where the model holds (filledfirst.analysis.step_time)."""
    top = max(float(points["measured_ms"].max() or 0), float(points["modelled_ms"].max() or 0), 1.0)
    diagonal = alt.Chart(pl.DataFrame({"x": [0.0, top], "y": [0.0, top]})).mark_line(
        color="gray", strokeDash=[4, 4]).encode(x="x:Q", y="y:Q")
    dots = alt.Chart(points).mark_circle(size=18, opacity=0.5).encode(
        x=alt.X("modelled_ms:Q", title="step the model gives (ms)"),
        y=alt.Y("measured_ms:Q", title="step measured (ms)"),
        color=alt.Color("setting:N", title="setting (its runs)"),
        tooltip=["setting:N", alt.Tooltip("modelled_ms:Q", format=".1f"), alt.Tooltip("measured_ms:Q", format=".1f"),
                 alt.Tooltip("steps:Q", format=",.0f")])
    return alt.layer(diagonal, dots).properties(
        width=WIDTH, height=260,
        title=alt.TitleParams("The engine's step time: measured against the fit, interval by interval",
                              anchor="start", fontSize=12))
