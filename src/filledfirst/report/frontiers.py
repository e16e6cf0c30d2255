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
from typing import NamedTuple

import altair as alt
import duckdb
import msgspec
import polars as pl

from filledfirst.analysis import numbers
from filledfirst.analysis.diagnosis.labels import Label
from filledfirst.analysis.diagnosis.rules import labelled
from filledfirst.analysis.frontiers import broke_on_backlog, lo_ratio, meaning, moved, probe_runs, unsearched
from filledfirst.analysis.numbers import DASH
from filledfirst.analysis.prediction import fills_after
from filledfirst.contracts.diagnosis import DiagnosisRow
from filledfirst.contracts.frontiers import Confirmation, FrontierRow, Intervention
from filledfirst.contracts.runmeta import FrontierProbe, RunMeta
from filledfirst.report import charts
from filledfirst.report.markup import Column, column_table, esc, html_table
from filledfirst.store.tables import table_exists
from filledfirst.study import DiagnosisRules

# --- data ------------------------------------------------------------------------------------


def frontier_rows(con: duckdb.DuckDBPyConnection) -> list[FrontierRow]:
    """Table `frontiers`, typed ([] when it is missing or empty: a study without searches)."""
    if not table_exists(con, "frontiers"):
        return []
    table = pl.from_arrow(con.sql("SELECT * FROM frontiers ORDER BY frontier, setting").to_arrow_table())
    return [FrontierRow.from_columns(r) for r in table.to_dicts()]


class ProbePoint(msgspec.Struct, frozen=True, kw_only=True):
    """A probe (its latest run) as the report shows it: its run.json block (`probe`:
    rate, attainment and its interval, verdict, missed...), its run, and its run's
    diagnosis label (`label`, where the report has it)."""

    frontier: str
    setting: str
    run_id: str
    status: str
    probe: FrontierProbe
    label: str | None = None

    @property
    def n_failed(self) -> int:
        """Its failed requests."""
        return (self.probe.missed or {}).get("failed") or 0

    @property
    def outright(self) -> bool:
        """It failed outright: as the search reads a probe (run.search), no verdict or an error."""
        return self.probe.attainment is None or bool(self.probe.error)

    @property
    def failed(self) -> bool:
        """It failed outright, or had failed requests."""
        return self.outright or self.n_failed > 0


def probe_points(con: duckdb.DuckDBPyConnection) -> list[ProbePoint]:
    """One per probe (its latest run), by frontier and setting, in probe order."""
    return [ProbePoint(frontier=name, setting=setting, run_id=run.run_id, status=run.status, probe=run.probe)
            for (name, setting), runs in probe_runs(con).items() for run in runs]


# --- what the table says -----------------------------------------------------------------------

SIGNALS = (  # (column of `frontiers`, how the report names the signal)
    ("waiting_from_rps", "waiting > 0"),
    ("cap_from_rps", "running at the cap"),
    ("kv_full_from_rps", "KV full"),
)


class Lead(NamedTuple):
    signals: list[str]  # the scheduler signals that crossed first (ties named together)
    rps: float | None  # the rate where they crossed
    lead: float | None  # hi_rps / that rate (> 1: they crossed before the SLO broke)


def leading_signal(row: FrontierRow) -> Lead:
    """The scheduler signal that crossed at the lowest probed rate (ties named together),
    that rate, and its lead: hi_rps / that rate (> 1: it crossed before the SLO broke)."""
    crossed = [(rps, name) for col, name in SIGNALS if (rps := getattr(row, col)) is not None]
    if not crossed:
        return Lead([], None, None)
    rps = min(r for r, _ in crossed)
    hi = row.hi_rps
    return Lead([n for r, n in crossed if r == rps], rps, hi / rps if hi is not None and rps > 0 else None)


def leading_text(row: FrontierRow) -> str:
    signals, rps, lead = leading_signal(row)
    if not signals:
        return DASH if unsearched(row) else "none crossed at any probed rate"
    text = f"{' and '.join(signals)} from {numbers.rps(rps)}"
    if lead is None:
        return text + " (the SLO never broke)"
    if lead > 1:
        return text + f": {lead:.2g}x ahead of the break at {numbers.rps(row.hi_rps)}"
    if lead == 1:
        return text + ": at the break itself, no warning"
    return text + f": only after the break at {numbers.rps(row.hi_rps)}"


def move_the_knee(row: FrontierRow) -> str:
    """One line from the knee's label: which knob the limit it names answers to (its rule's)."""
    if unsearched(row):
        return f"not searched: judged side by side with {row.parent}"
    if row.hi_rps is None:
        return "nothing broke: raise the search's maximum rate to find the knee"
    return meaning(row.knee_label).moves_the_knee or "no single limit named at the knee: read the clue"


def _held(r: FrontierRow) -> str:
    if r.lo_rps is None:
        return DASH
    tok_s = r.lo_output_tok_s
    return numbers.rps(r.lo_rps) + ("" if tok_s is None else f" ({numbers.count(round(tok_s))} output tok/s)")


def knee_interval(r: FrontierRow) -> str:
    """The knee's interval: '29 to 33.8 req/s (90 %)', hi marked when it never showed a verdict."""
    floor, hi = r.floor_rps, r.hi_rps
    if floor is None:
        return DASH
    upper = "no break" if hi is None else f"{hi:,.3g}" + (" (inconclusive)" if r.hi_inconclusive else "")
    conf = r.confidence
    return f"{floor:,.3g} to {upper} req/s" + ("" if not conf else f" ({numbers.share(conf)})")


def drift_text(r: FrontierRow) -> str:
    """The server's speed on the closed loop after the search against before it."""
    if r.drift is None:
        return DASH
    text = (f"{numbers.change(r.drift)} ({numbers.rps(r.drift_start_rps)} before, "
            f"{numbers.rps(r.drift_end_rps)} after)")
    return ("DRIFTED: " + text + ", measure again on a quiet server") if r.drifted else text


def _stop(r: FrontierRow) -> str:
    stop = r.reason or DASH
    return f"{stop}: {r.error}" if r.error else stop


# One setting's line of a frontier's table: (header, cell of a `frontiers` row), in order.
FRONTIER_COLUMNS: list[Column[FrontierRow]] = [
    ("setting", lambda r: r.setting),
    ("highest rate that held", _held),
    ("lowest that broke", lambda r: numbers.rps(r.hi_rps)),
    ("capacity interval", knee_interval),
    ("drift over the search", drift_text),
    ("what filled first at the knee", lambda r: r.knee_label or DASH),
    ("clue", lambda r: r.knee_clue or ""),
    ("leading signal", leading_text),
    ("what would move the knee", move_the_knee),
    ("search stopped", _stop),
]


def frontier_table_html(rows: Sequence[FrontierRow]) -> str:
    """The rows of one frontier, a line per setting."""
    return column_table(FRONTIER_COLUMNS, rows)


# --- predicted against measured -----------------------------------------------------------------


def _limit_at(limit: str | None, rps: float | None) -> str:
    return DASH if limit is None else f"{limit} at {numbers.rps(rps)}"


def _ratio(r: FrontierRow) -> str:
    p = r.prediction
    return DASH if p is None or p.predicted_ratio is None else f"{p.predicted_ratio:.2f}"


PREDICTED_COLUMNS: list[Column[FrontierRow]] = [
    ("setting", lambda r: r.setting),
    ("measured knee", lambda r: numbers.rps(r.knee_rps)),
    ("what filled first", lambda r: r.knee_label or DASH),
    ("predicted to fill first", lambda r: _limit_at(r.prediction.predicted_first, r.prediction.predicted_rps)
     if r.prediction else DASH),
    ("then", lambda r: _limit_at(r.prediction.predicted_next, r.prediction.predicted_next_rps)
     if r.prediction else DASH),
    ("measured / predicted", _ratio),
    ("step model", lambda r: DASH if r.prediction is None else f"the {r.prediction.model_scope}'s"),
    ("what it would take (predicted)", lambda r: (r.prediction.would_take or DASH) if r.prediction else DASH),
]


def predicted_table_html(rows: Sequence[FrontierRow]) -> str:
    """Each search's knee as its step model predicts it, beside the measured one."""
    return column_table(PREDICTED_COLUMNS, [r for r in rows if r.prediction is not None])


# --- what moved the knee --------------------------------------------------------------------------


def relaxation_text(i: Intervention) -> str:
    """'max_num_seqs 8 -> 16', 'KV tokens 20,480 -> 40,960'."""
    return f"{i.knob} {numbers.count(i.relaxed_from)} -> {numbers.count(i.relaxed_to)}"


def _shift(i: Intervention) -> str:
    shift = i.shift
    if shift is None:
        return DASH
    where = {"up": "above its interval", "down": "below its interval", "no": "within the intervals"}
    if i.within_drift:
        return f"{numbers.change(shift)} (within what the server's drift allows)"
    if i.moved == "no" and i.interval_move in ("up", "down"):
        return f"{numbers.change(shift)} ({where[i.interval_move]}, less than the least shift that counts)"
    return numbers.change(shift) + (f" ({where[i.moved]})" if i.moved in where else "")


def predicted_shift_text(i: Intervention) -> str:
    """The shift the parent's prediction gives a relaxation; one below the least shift that
    counts cannot show as a move, whatever the search finds. A relaxation further than a
    doubling (the original study's) says what a doubling was predicted to give."""

    def said(shift: float | None) -> str:
        below = shift is not None and i.least_shift is not None and shift < i.least_shift
        return numbers.change(shift) + (" (less than the least shift: predicted not to move it)" if below else "")

    text = said(i.predicted_shift)
    if i.predicted_shift_doubled is not None:
        text += f"; doubled: {said(i.predicted_shift_doubled)}"
    return text


# An intervention's paired verdict as what it says of that intervention: did relaxing move the server?
_PAIRED_MOVE = {Confirmation.CONFIRMED: "moved", Confirmation.NOT_CONFIRMED: "did not move",
                Confirmation.INCONCLUSIVE: "inconclusive"}


def paired_text(i: Intervention) -> str:
    """'+58 % (pairs +55 % to +61 %): moved; predicted +50 %': the paired check's shift,
    its verdict, and the shift the parent's model predicted for it."""
    if i.paired_verdict is None:
        return DASH
    said = _PAIRED_MOVE[Confirmation(i.paired_verdict)]
    predicted = "" if i.predicted_paired_shift is None else f"; predicted {numbers.change(i.predicted_paired_shift)}"
    if i.paired_shift is None:
        return f"{said} (a block failed){predicted}"
    return (f"{numbers.change(i.paired_shift)} (pairs {numbers.change(i.paired_shift_lo)} to "
            f"{numbers.change(i.paired_shift_hi)}): {said}{predicted}")


class MovedLine(msgspec.Struct, frozen=True):
    """A line of What moved the knee: an intervention's row under its parent's."""

    parent: FrontierRow
    row: FrontierRow
    i: Intervention  # the row's intervention


def least_shift_text(line: MovedLine) -> str:
    """'30 %', or '51 % (30 %, widened by the parent's drift of -16 %)'."""
    least, minimum, drift = line.i.least_shift, line.i.min_shift, line.parent.drift
    if least is None:
        return DASH
    if minimum is None or drift is None or abs(least - minimum) < 0.005:
        return numbers.share(least)
    return (f"{numbers.share(least)} ({numbers.share(minimum)}, widened by the parent's drift of "
            f"{numbers.change(drift)})")


def _role(line: MovedLine) -> str:
    return line.i.role or "no limit named at the knee"


def _verdict(line: MovedLine) -> str:
    """The parent's verdict on the relaxed line; on a line with no role, why there is none."""
    parent = line.parent
    if line.i.role != "relaxed":
        return DASH if line.i.role else (parent.verdict_why or DASH)
    return f"{parent.verdict or DASH}: {parent.verdict_why or ''}".rstrip(": ")


def moved_rows(rows: Sequence[FrontierRow]) -> list[tuple[FrontierRow, list[MovedLine]]]:
    """(a setting of one frontier, its interventions' lines: the relaxed one first), for the
    settings that have interventions."""
    out = []
    for p in rows:
        mine = [MovedLine(p, r, r.intervention) for r in rows if r.intervention and r.intervention.parent == p.setting]
        if mine:
            out.append((p, sorted(mine, key=lambda line: (line.i.role != "relaxed", line.row.setting))))
    return out


def _predicted_next(line: MovedLine) -> str:
    """What the parent's prediction says fills first at the relaxed knee
    (filledfirst.analysis.prediction.fills_after), on the relaxed line of an intervention
    that was not searched (nothing measured it)."""
    p, shift = line.parent.prediction, line.i.predicted_shift
    if not unsearched(line.row) or line.i.role != "relaxed" or p is None or shift is None:
        return DASH
    limit, rps, again = fills_after(p, shift)
    return f"{_limit_at(limit, rps)}{' again' if again else ''} (predicted)"


PAIRED_HEADER = "side by side (completions per second)"
# A line of What moved the knee: (header, cell), in order.
MOVED_COLUMNS: list[Column[MovedLine]] = [
    ("setting", lambda line: line.parent.setting),
    ("what filled first", lambda line: line.parent.knee_label or DASH),
    ("intervention", lambda line: f"{line.row.setting}: {relaxation_text(line.i)}"),
    ("its role", _role),
    ("knee before", lambda line: knee_interval(line.parent)),
    ("knee after", lambda line: "not searched" if unsearched(line.row) else knee_interval(line.row)),
    ("shift of the highest rate held", lambda line: _shift(line.i)),
    (PAIRED_HEADER, lambda line: paired_text(line.i)),
    ("predicted shift", lambda line: predicted_shift_text(line.i)),
    ("least shift that counts", least_shift_text),
    ("verdict", _verdict),
    ("what filled first at the new knee", lambda line: line.row.knee_label or _predicted_next(line)),
]


def moved_table_html(rows: Sequence[FrontierRow]) -> str:
    """What moved the knee: a line per intervention of each verified setting, with the
    knee before and after, the shift of the highest rate that held, the verdict (on the
    relaxed line) and what filled first at the new knee; the paired checks' column where
    any was made."""
    lines = [line for _, mine in moved_rows(rows) for line in mine]
    paired = any(line.i.paired_verdict is not None for line in lines)
    return column_table([c for c in MOVED_COLUMNS if paired or c[0] != PAIRED_HEADER], lines)


# --- a frontier's knees side by side (a part's `knees`) -------------------------------------------


def knee_shift_table_html(rows: Sequence[FrontierRow], min_shift: float) -> str:
    """One frontier's searched settings (interventions left out), each knee against the
    first setting's: the ratio of the highest rates held and whether it moved
    (analysis.frontiers.moved: disjoint intervals and a change of at least `min_shift`)."""
    searched = [r for r in rows if not r.parent]
    if not searched:
        return ""
    base = searched[0]

    def against(r: FrontierRow) -> str:
        if r is base:
            return "the baseline"
        ratio, move = lo_ratio(base.lo_rps, r.lo_rps), moved(base, r, min_shift)
        where = {"up": "moved up", "down": "moved down", "no": "within the noise"}
        return (DASH if ratio is None else f"x{ratio:.2f}") + (f" ({where[move]})" if move in where else "")

    return column_table([
        ("setting", lambda r: r.setting),
        ("capacity interval", knee_interval),
        (f"knee against {base.setting}", against),
        ("what filled first at the knee", lambda r: r.knee_label or DASH),
    ], searched)


def frontier_intro(rows: Sequence[FrontierRow]) -> str:
    r = rows[0]
    return (f"Workload {r.workload or DASH}; SLO: TTFT <= {r.slo_ttft_ms:g} ms and no gap between "
            f"tokens over {r.slo_itl_ms:g} ms for {100 * (r.target or 0):g} % of a probe's requests.")


# --- the chart ------------------------------------------------------------------------------------


DECIDED = ("held", "broke: attainment below the target", "broke: its backlog grew")
SHAPES = ["circle", "triangle-down", "diamond"]


def decided(p: ProbePoint) -> str | None:
    """What decided a measured probe (None: it failed outright): it held, its attainment
    broke the target, or its requests met it while its backlog grew."""
    if p.outright:
        return None
    if p.probe.held:
        return DECIDED[0]
    return DECIDED[2] if broke_on_backlog(p.probe) else DECIDED[1]


def frontier_chart(rows: Sequence[FrontierRow], points: Sequence[ProbePoint]) -> alt.LayerChart:
    """Attainment against the probed rate, a line per setting through its measured probes,
    each shaped by what decided it (`decided`), the knee's bracket (lo to hi) shaded in the
    setting's colour, the target as a dashed rule; probes with failures in red, a probe
    that failed outright as a red cross at 0."""
    target = next((r.target for r in rows if r.target is not None), None)
    data = pl.DataFrame(
        [{"setting": p.setting, "probe": p.probe.probe, "rate": p.probe.rate,
          "attainment": None if p.probe.attainment is None else 100 * p.probe.attainment,
          "shown": 0.0 if p.probe.attainment is None else 100 * p.probe.attainment,
          "verdict": ("failed: " + (p.probe.error or p.status or "no verdict")) if p.outright
          else ("held" if p.probe.held else "broke"),
          "decided": decided(p),
          "failed": p.n_failed, "bad": p.failed, "outright": p.outright, "run": p.run_id}
         for p in points],
        schema={"setting": pl.String, "probe": pl.Int64, "rate": pl.Float64, "attainment": pl.Float64,
                "shown": pl.Float64, "verdict": pl.String, "decided": pl.String, "failed": pl.Int64,
                "bad": pl.Boolean,
                "outright": pl.Boolean, "run": pl.String},
    ).sort("setting", "rate")
    x_title = "offered rate (requests/s, log)"
    x = alt.X("rate:Q", title=x_title, scale=alt.Scale(type="log", nice=False))
    y = alt.Y("shown:Q", title="attainment (% of requests meeting the SLO)", scale=alt.Scale(domain=[0, 100]))
    color = alt.Color("setting:N", title="setting")
    tooltip = ["setting:N", "probe:Q", alt.Tooltip("rate:Q", format=".3g"),
               alt.Tooltip("attainment:Q", format=".1f", title="attainment %"), "verdict:N",
               alt.Tooltip("decided:N", title="what decided it"),
               alt.Tooltip("failed:Q", title="failed requests"), "run:N"]
    measured = data.filter(~pl.col("outright"))
    layers: list[alt.TopLevelMixin] = []
    # An empty layer draws nothing but warns in the browser's console: only layers with data.
    brackets = pl.DataFrame(
        [{"setting": r.setting, "lo": r.lo_rps, "hi": r.hi_rps} for r in rows
         if r.lo_rps is not None and r.hi_rps is not None],
        schema={"setting": pl.String, "lo": pl.Float64, "hi": pl.Float64},
    )
    if brackets.height:
        layers.append(alt.Chart(brackets).mark_rect(opacity=0.15).encode(
            x=alt.X("lo:Q", title=x_title, scale=alt.Scale(type="log", nice=False)), x2="hi:Q", color=color,
            tooltip=["setting:N", alt.Tooltip("lo:Q", title="knee: held at", format=".3g"),
                     alt.Tooltip("hi:Q", title="knee: broke at", format=".3g")]))
    edges = pl.DataFrame(
        [{"setting": r.setting, "rate": v, "edge": edge} for r in rows
         for edge, v in (("held at", r.lo_rps), ("broke at", r.hi_rps)) if v is not None],
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
        layers.append(base.mark_point(size=80, opacity=1, filled=True).encode(
            x=x, y=y, tooltip=tooltip, shape=alt.Shape("decided:N", title="what decided it",
                                                       scale=alt.Scale(domain=list(DECIDED), range=SHAPES)),
            color=alt.condition(alt.datum.bad, alt.value(charts.FAILED_COLOR), color)))
    outright = data.filter(pl.col("outright"))
    if outright.height:
        layers.append(alt.Chart(outright).mark_point(shape="cross", size=140, filled=True,
                                                     color=charts.FAILED_COLOR).encode(x=x, y=y, tooltip=tooltip))
    n_bad = int(data["bad"].sum())
    subtitle = ("shaded: the knee (highest rate that held to lowest that broke); dashed gray: the target; "
                "a probe's shape: what decided it (a probe whose requests met the SLO broke on its growing "
                "backlog); "
                + (f"red: {n_bad} probe(s) with failures (a cross at 0: failed outright)" if n_bad
                   else "no probe had failures"))
    return alt.layer(*layers).properties(
        width=charts.WIDTH, height=260,
        title=alt.TitleParams(f"Attainment against offered rate: {rows[0].frontier}", subtitle=subtitle,
                              anchor="start", fontSize=12),
    )


def by_frontier(rows: Sequence[FrontierRow], points: Sequence[ProbePoint]
                ) -> list[tuple[str, list[FrontierRow], list[ProbePoint]]]:
    """(frontier, its rows, its probes), frontiers in name order; a frontier probed but not
    yet in table `frontiers` (the database not diagnosed) comes with no rows."""
    names = sorted({r.frontier for r in rows} | {p.frontier for p in points})
    return [(n, [r for r in rows if r.frontier == n], [p for p in points if p.frontier == n]) for n in names]


def by_setting(rows: Sequence[FrontierRow], points: Sequence[ProbePoint]) -> list[tuple[str, list[ProbePoint]]]:
    """(setting, its probes in probe order) of one frontier: the settings of its table
    first, in its order, then any probed setting the table lacks."""
    settings = dict.fromkeys([*(r.setting for r in rows), *(p.setting for p in points)])
    return [(s, sorted((p for p in points if p.setting == s), key=lambda p: p.probe.probe)) for s in settings]


# --- one search's probes -------------------------------------------------------------------------


def probe_verdict(p: ProbePoint) -> str:
    if p.outright:
        return "failed: " + (p.probe.error or p.status or "no verdict")
    # the probe's own verdict (a rate is judged by its probes pooled); older probes have only `held`
    return p.probe.verdict or {True: "held", False: "broke"}.get(p.probe.held, "no verdict")


def _interval(p: ProbePoint) -> str:
    lo, hi = p.probe.attainment_lo, p.probe.attainment_hi
    return DASH if lo is None or hi is None else f"{100 * lo:.1f} to {100 * hi:.1f} %"


def _growth(p: ProbePoint) -> str:
    g = p.probe.backlog_growth
    return DASH if g is None else f"{g:+.3f} s/s"


def _missed(key: str) -> Callable[[ProbePoint], str]:
    return lambda p: numbers.count((p.probe.missed or {}).get(key))


def _attainment(p: ProbePoint) -> str:
    # one decimal: a whole percentage would round 94.6 % up to a 95 % target
    return DASH if p.probe.attainment is None else f"{100 * p.probe.attainment:.1f} %"


# A probe's line (with its run's diagnosis label).
PROBE_COLUMNS: list[Column[ProbePoint]] = [
    ("probe", lambda p: p.probe.probe),
    ("rate", lambda p: numbers.rps(p.probe.rate)),
    ("length", lambda p: numbers.seconds(p.probe.probe_s)),
    ("requests", lambda p: numbers.count(p.probe.requests)),
    ("attainment", _attainment),
    ("its interval", _interval),
    ("backlog growth", _growth),
    ("verdict", probe_verdict),
    ("lifetime p90", lambda p: numbers.seconds(p.probe.lifetime_p90_s)),
    ("what filled first (its diagnosis)", lambda p: p.label or DASH),
    ("failed", _missed("failed")),
    ("over the TTFT SLO", _missed("ttft")),
    ("over the ITL SLO", _missed("itl")),
    ("run", lambda p: p.run_id),
]


def probe_table_html(points: Sequence[ProbePoint], labels: Mapping[str, str]) -> str:
    """One search's probes, a line each (`labels`: the diagnosis' label per run id)."""
    return column_table(PROBE_COLUMNS, [msgspec.structs.replace(p, label=labels.get(p.run_id)) for p in points])


def probes_summary(setting: str, points: Sequence[ProbePoint]) -> str:
    """The folded block's one line: the setting, how many probes, the rates they spanned."""
    rates = [p.probe.rate for p in points]
    span = f", {numbers.rps(min(rates))} to {numbers.rps(max(rates))}" if len(set(rates)) > 1 else ""
    return f"{setting}: its {len(points)} probe{'s' if len(points) != 1 else ''}{span}"


# --- the one-screen summary ---------------------------------------------------------------------


def key_number(d: DiagnosisRow, rules: DiagnosisRules) -> str:
    """The one number that shows a run's label (its rule's)."""
    return labelled(d.label).key_number(d, rules)


class GlanceRow(msgspec.Struct, frozen=True):
    """A line of At a glance."""

    part: str
    what: str  # the run, or the frontier's setting
    designed: str  # the pattern it was designed for
    found: str  # what filled first (and, where two limits filled, the second)
    number: str  # the one number that shows it
    mark: str  # "as designed", "DIFFERS" (a designed pattern not found first) or ""


def summary_rows(diagnosis: Sequence[DiagnosisRow], metas: Mapping[str, RunMeta],
                 frontiers: Sequence[FrontierRow], rules: DiagnosisRules,
                 parts: Sequence[str] = ()) -> list[GlanceRow]:
    """Designed experiments (not the probes) grouped by their part in the study's order
    (`parts`: the names, in order; others after them), then one line per (frontier,
    setting)."""
    order = {p: i for i, p in enumerate(parts)}
    part = {run_id: m.part for run_id, m in metas.items()}
    designed = [d for d in diagnosis if not (d.run_id in metas and metas[d.run_id].frontier)]
    designed.sort(key=lambda d: order.get(part.get(d.run_id), len(order)))  # stable
    out = []
    for d in designed:
        expect, label = d.expect, d.label or Label.UNCLASSIFIED
        # where two limits filled, what filled next too (the label is the first)
        found = f"{label}, then {d.then_filled}" if d.then_filled else label
        out.append(GlanceRow(part=part.get(d.run_id) or DASH, what=d.experiment, designed=expect or DASH,
                             found=found, number=key_number(d, rules),
                             mark="" if not expect else ("as designed" if expect == label else "DIFFERS")))
    for r in frontiers:
        if r.parent:
            continue  # an intervention: its parent's line gives the verdict
        if r.hi_rps is None:
            number = f"held up to {numbers.rps(r.lo_rps)}, never broke"
        else:
            number = f"held {numbers.rps(r.lo_rps)}, broke at {numbers.rps(r.hi_rps)}"
        if r.floor_rps is not None:
            number += f"; capacity {knee_interval(r)}"
        if r.drift is not None:
            number += f"; drift {numbers.change(r.drift)}" + (" (DRIFTED)" if r.drifted else "")
        found = r.knee_label or DASH
        if r.verdict:
            found += f" ({r.verdict} by intervention" + (f"; next: {r.next_label})" if r.next_label else ")")
        out.append(GlanceRow(part=f"frontier {r.frontier}", what=r.setting, designed=DASH, found=found,
                             number=number, mark=""))
    return out


def summary_table(rows: Sequence[GlanceRow]) -> str:
    """A small table; a part's name only on its first line, a difference in bold."""
    body, last = [], None
    for r in rows:
        part = r.part if r.part != last else ""
        last = r.part
        body.append([part, r.what, r.designed, r.found, r.number, r.mark])
    html = html_table(["part", "run", "designed for", "what filled first", "the number that shows it", ""], body)
    # the one mark that must catch the eye; `esc` makes the cell text, so the literal is safe
    return html.replace(f"<td>{esc('DIFFERS')}</td>", "<td><strong>differs</strong></td>")
