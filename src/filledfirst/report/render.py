"""Render reports/report.qmd against a DuckDB file: with Quarto if present, else Jupyter.

Quarto cannot be installed everywhere (its PyPI package downloads a binary at install
time), so the same .qmd also renders through a fallback CI exercises: parse the .qmd into
a notebook, execute it with nbclient in this interpreter's environment, export it with
nbconvert. Either way the DB path reaches the document through FILLEDFIRST_DB, and the
result must be one self-contained HTML file with no remote script or stylesheet.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from filledfirst.atomic import write_text
from filledfirst.errors import UserError

log = logging.getLogger(__name__)

DB_ENV = "FILLEDFIRST_DB"
COMPARE_ENV = "FILLEDFIRST_COMPARE"  # the href of the study's comparison with its baseline, if any
PUBLISH_ENV = "FILLEDFIRST_PUBLISH"  # "1": host names and server command lines left out
ENGINES = ("auto", "quarto", "fallback")
CELL_TIMEOUT_S = 600


class RenderError(UserError):
    """The report could not be rendered; no output file was written."""


# --- entry point ---------------------------------------------------------------------------


def render_report(source: Path, db: Path, out: Path, engine: str = "auto", title: str | None = None,
                  compare: str | None = None, publish: bool = False) -> None:
    """Render `source` against `db` into `out` (whole or not at all); `title` in place of
    the document's own; `compare`: the link to this study's comparison with its baseline;
    `publish`: without host names and server command lines."""
    source, db, out = Path(source).resolve(), Path(db).resolve(), Path(out).resolve()
    if engine not in ENGINES:
        raise RenderError(f"unknown report engine {engine!r}; use one of {ENGINES}")
    if not source.is_file():
        raise RenderError(f"report source {source} does not exist")
    if not db.is_file():
        raise RenderError(f"database {db} does not exist; run `filledfirst ingest` first")
    quarto = shutil.which("quarto")
    if engine == "quarto" and quarto is None:
        raise RenderError("--engine quarto but `quarto` is not on PATH (conda-forge has it)")
    if quarto is not None and engine in ("auto", "quarto"):
        html = _render_quarto(quarto, source, _report_env(db, compare, publish), title)
    else:
        html = _render_fallback(source, _report_env(db, compare, publish), title)
    remote = remote_references(html)
    if remote:
        raise RenderError(f"rendered report loads remote resources, refusing: {remote[:3]}")
    write_text(html, out)
    log.info("report written to %s", out)


# --- Quarto --------------------------------------------------------------------------------


def _render_quarto(quarto: str, source: Path, report_env: dict[str, str], title: str | None) -> str:
    env = {**os.environ, **report_env, "QUARTO_PYTHON": sys.executable}
    with tempfile.TemporaryDirectory(prefix="filledfirst-quarto-") as tmp:
        # --output-dir keeps Quarto's side files out of the source tree.
        argv = [quarto, "render", str(source), "--to", "html", "--output-dir", tmp]
        if title:
            argv += ["--metadata", f"title:{json.dumps(title)}"]  # a YAML string, whatever it holds
        proc = subprocess.run(argv, env=env, cwd=source.parent, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RenderError(f"quarto render failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        produced = Path(tmp) / f"{source.stem}.html"
        if not produced.is_file():
            raise RenderError(f"quarto render succeeded but wrote no {produced.name}")
        return produced.read_text()


# --- fallback: .qmd -> notebook ------------------------------------------------------------


@dataclass(slots=True)
class Cell:
    kind: str  # "markdown" | "code"
    source: str
    options: dict[str, Any] = field(default_factory=dict)
    line: int = 1  # where the cell starts in the .qmd, for error messages


_FRONT_MATTER = re.compile(r"\A---[ \t]*\n(.*?)\n---[ \t]*\n", re.S)
_FENCE_OPEN = re.compile(r"^```\{python\b[^}]*\}[ \t]*$")
_FENCE_CLOSE = re.compile(r"^```[ \t]*$")
_OPTION = re.compile(r"^#\|\s?(.*)$")


def parse_qmd(text: str) -> tuple[dict[str, Any], list[Cell]]:
    """Front matter, then alternating markdown and ```{python} cells with `#|` options."""
    front: dict[str, Any] = {}
    offset = 0
    m = _FRONT_MATTER.match(text)
    if m:
        front = yaml.safe_load(m.group(1)) or {}
        offset = m.group(0).count("\n")
        text = text[m.end():]
    cells: list[Cell] = []
    lines = text.split("\n")
    buf: list[str] = []
    start = offset + 1
    i = 0
    while i < len(lines):
        if _FENCE_OPEN.match(lines[i]):
            _add_markdown(cells, buf, start)
            j = i + 1
            while j < len(lines) and not _FENCE_CLOSE.match(lines[j]):
                j += 1
            if j == len(lines):
                raise RenderError(f"line {offset + i + 1}: ```{{python}} cell is never closed")
            cells.append(_code_cell(lines[i + 1:j], offset + i + 1))
            buf, start, i = [], offset + j + 2, j + 1
        else:
            buf.append(lines[i])
            i += 1
    _add_markdown(cells, buf, start)
    return front, cells


def _add_markdown(cells: list[Cell], buf: list[str], line: int) -> None:
    body = "\n".join(buf).strip("\n")
    if body.strip():
        cells.append(Cell("markdown", body, line=line))


def _code_cell(body: list[str], line: int) -> Cell:
    opts: list[str] = []
    while body and (m := _OPTION.match(body[0])):
        opts.append(m.group(1))
        body = body[1:]
    options = yaml.safe_load("\n".join(opts)) if opts else {}
    if not isinstance(options, dict):
        raise RenderError(f"line {line}: `#|` options must be `key: value` lines")
    return Cell("code", "\n".join(body).strip("\n"), options, line)


def build_notebook(front: dict[str, Any], cells: list[Cell]):
    """The notebook the fallback executes; `eval: false` cells are left out entirely."""
    import nbformat.v4 as nbf

    nb = nbf.new_notebook()
    title = front.get("title")
    if title:
        nb.metadata["title"] = str(title)  # nbconvert's <title>
        nb.cells.append(nbf.new_markdown_cell(f"# {title}"))
    for cell in cells:
        if cell.kind == "markdown":
            nb.cells.append(nbf.new_markdown_cell(cell.source))
        elif cell.options.get("eval", True):
            nb_cell = nbf.new_code_cell(cell.source)
            nb_cell.metadata["filledfirst"] = {"options": cell.options, "line": cell.line}
            nb.cells.append(nb_cell)
    return nb


# --- fallback: execute and export ----------------------------------------------------------


def _absolute_pythonpath() -> dict[str, str]:
    """PYTHONPATH with every entry absolute: the kernel starts in the report's folder, where
    a relative entry (`PYTHONPATH=src`) would find nothing and the installed package instead."""
    value = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join(os.path.abspath(p) for p in value.split(os.pathsep) if p)} if value else {}


def _report_env(db: Path, compare: str | None, publish: bool) -> dict[str, str]:
    """What the report's cells read from the environment, whichever engine runs them."""
    return {DB_ENV: str(db), **({COMPARE_ENV: compare} if compare else {}), **({PUBLISH_ENV: "1"} if publish else {}),
            **_absolute_pythonpath()}


def _kernel_manager(kernel_dir: Path, report_env: dict[str, str]):
    """A kernel on *this* interpreter, so it imports the same filledfirst and packages.

    A `python3` spec found on the machine may point at another Python; an explicit spec
    in a private folder cannot.
    """
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    name = "filledfirst-report"
    spec_dir = kernel_dir / name
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "filledfirst report",
        "language": "python",
        "env": report_env,
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    return KernelManager(kernel_name=name, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernel_dir)]))


def execute_notebook(nb, cwd: Path, report_env: dict[str, str], timeout_s: int = CELL_TIMEOUT_S) -> None:
    """Run every code cell in order; the first error aborts with the cell and its error."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    with tempfile.TemporaryDirectory(prefix="filledfirst-kernel-") as kdir:
        km = _kernel_manager(Path(kdir), report_env)
        client = NotebookClient(
            nb, km=km, timeout=timeout_s, allow_errors=False,
            resources={"metadata": {"path": str(cwd)}},  # Quarto runs in the .qmd's folder too
        )
        code_no = 0
        try:
            with client.setup_kernel():
                for index, cell in enumerate(nb.cells):
                    if cell.cell_type != "code":
                        continue
                    code_no += 1
                    try:
                        client.execute_cell(cell, index, execution_count=code_no)
                    except CellExecutionError as exc:
                        line = cell.metadata.get("filledfirst", {}).get("line", "?")
                        raise RenderError(
                            f"report cell {code_no} (qmd line {line}) failed: {exc.ename}: {exc.evalue}\n"
                            f"{_strip_ansi(exc.traceback)}"
                        ) from None
        finally:
            # nbclient shuts down only a kernel manager it made itself: this one would
            # outlive the render, idle, until this process ends.
            if km.has_kernel:
                km.shutdown_kernel(now=True)


def _apply_output_options(nb, front: dict[str, Any]) -> None:
    """Quarto's `include`, `output` and `warning` options, cell over document default."""
    defaults = front.get("execute") or {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        opts = {**defaults, **cell.metadata.get("filledfirst", {}).get("options", {})}
        if opts.get("include", True) is False or opts.get("output", True) is False:
            cell.outputs = []
        elif opts.get("warning", True) is False:
            cell.outputs = [o for o in cell.outputs if o.get("name") != "stderr"]


_EMPTY_SCRIPT = re.compile(r'<script\s+src=""\s*>\s*</script>\s*')
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def export_html(nb) -> str:
    from nbconvert.exporters import HTMLExporter

    # Empty URLs drop the CDN links the lab template adds for require.js and MathJax
    # (they must be traits: the exporter overwrites those keys of `resources`).
    exporter = HTMLExporter(template_name="lab", exclude_input=True, exclude_input_prompt=True,
                            exclude_output_prompt=True, require_js_url="", mathjax_url="")
    body, _ = exporter.from_notebook_node(nb)
    return _EMPTY_SCRIPT.sub("", body)


def _render_fallback(source: Path, report_env: dict[str, str], title: str | None) -> str:
    front, cells = parse_qmd(source.read_text())
    if title:
        front = {**front, "title": title}
    nb = build_notebook(front, cells)
    execute_notebook(nb, source.parent, report_env)
    _apply_output_options(nb, front)
    html = export_html(nb)
    toc = (front.get("format") or {}).get("html") or {}
    return with_toc(html, int(toc.get("toc-depth", 3))) if toc.get("toc") else html


# nbconvert's headings (markdown cells and Markdown outputs alike): an id and an anchor link
_HEADING = re.compile(r'<h([2-6]) id="([^"]+)">(.*?)(?:<a class="anchor-link"[^>]*>[^<]*</a>)?</h\1>', re.S)
_TITLE_END = re.compile(r"</h1>")
_MAIN = re.compile(r"<main[^>]*>")


def with_toc(html: str, depth: int) -> str:
    """Quarto's `toc` for the fallback: a list of links to the headings down to `depth`,
    after the title (at the top of the page without one). The heading text is nbconvert's,
    escaped already."""
    items = [f'<li style="margin-left: {int(level) - 2}em"><a href="#{anchor}">{text}</a></li>'
             for level, anchor, text in _HEADING.findall(html) if int(level) <= depth]
    if not items:
        return html
    nav = f'<nav id="TOC" role="doc-toc"><p><strong>Table of contents</strong></p><ul>{"".join(items)}</ul></nav>'
    at = _TITLE_END.search(html) or _MAIN.search(html)
    return html if at is None else html[:at.end()] + nav + html[at.end():]


# --- checks --------------------------------------------------------------------------------

_REMOTE = re.compile(
    r"<(?:script|link|img|iframe|embed|source)\b[^>]*?\b(?:src|href)\s*=\s*[\"']?\s*((?:https?:)?//[^\"'\s>]+)",
    re.I,
)


def remote_references(html: str) -> list[str]:
    """URLs the page would fetch on load (plain <a> links are fine: nothing loads them)."""
    return _REMOTE.findall(html)

