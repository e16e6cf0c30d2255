"""Security properties, fast and without vLLM: every string from a config, a trace or a
server that reaches the report is escaped; no config value reaches a shell; servers
listen on loopback unless the config says otherwise."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from filledfirst import config as config_module
from filledfirst.analysis.diagnosis import write_diagnosis
from filledfirst.contracts.records import SampleRecord
from filledfirst.engine import server as server_module
from filledfirst.engine import shared
from filledfirst.engine.server import VllmServer, log_excerpt
from filledfirst.report import render
from filledfirst.store.ingest import ingest
from filledfirst.study import DiagnosisRules, as_study

from conftest import REPO
from helpers.chromium import chromium_run
from helpers.fake_server import FakeVllm
from helpers.popen import record_popen
from helpers.report_runs import QMD, make_request, run_meta, series
from helpers.run_folder import write_run

# --- the report escapes every data string ------------------------------------------------------

SCRIPT = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(2)>"
ATTR = '" onmouseover="alert(3)'  # breaking out of a quoted attribute
PAYLOADS = (SCRIPT, IMG, ATTR)
RUN_OK = f"ok {IMG}"  # a run id is a folder name: no '/'
RUN_FAILED = "failed-run"


def _hostile_run(root: Path) -> Path:
    """Every field of run.json the report shows, and the request rows, carry markup."""
    meta = run_meta(RUN_OK, f"interference {SCRIPT}", "ok", 8, started=1, part="interference")
    meta.update(
        description=f"config description {IMG} {SCRIPT}",
        expect=f"pattern {SCRIPT}",
        model={**meta["model"], "name": f"model {SCRIPT}"},
        versions={"vllm": IMG, "python": ATTR},
        hardware={**meta["hardware"], "gpu": SCRIPT, ATTR: IMG},  # in a key, too
        timings={"startup_s": 2.0, "note": ATTR},
    )
    meta["server"]["argv"] += ["--served-model-name", SCRIPT, "; rm -rf /"]
    meta["server"]["settings"]["extra_args"] = [IMG]
    # a trace's stats, as the schedule's stats file would carry them
    meta["schedule"] = {"n_requests": 4, "source": IMG,
                        "stats": {"requests": 4, "duration_s": 2.0, "keep_every": 2,
                                  "prompt_tokens": {"p50": 150, "p90": 150, "max": 150},
                                  "output_tokens": {"p50": 2, "p90": 2, "max": 2},
                                  "relative": [{"key": "time_scale", "of": ATTR, "knee_rps": 1.0, "reason": "converged",
                                                "search": IMG, "times": 2.0, "rate_rps": 2.0}]}}
    built = [
        make_request(0, SCRIPT, 0.0, [(0.05, 1), (0.06, 1)]),  # roles come from the trace or workload
        make_request(1, SCRIPT, 0.1, [(0.15, 1), (0.17, 1)]),
        make_request(2, IMG, 0.5, [(0.60, 1), (0.62, 1)]),
        # the server's error text, shown in the chart's tooltip
        make_request(3, IMG, 0.7, [(0.80, 1)], status="http_error", error=f"{SCRIPT} {IMG} {ATTR}"),
    ]
    ts = [0.0, 0.5, 1.0]
    samples = (series("vllm:num_requests_running", [[0, 2, 1]], ts)
               + series("vllm:num_requests_waiting", [[0, 0, 0]], ts)
               + series("vllm:kv_cache_usage_perc", [[0.0, 0.1, 0.05]], ts)
               + [SampleRecord(0.0, "vllm:num_preemptions_total", f"model_name={SCRIPT}", 0.0)])
    return write_run(root / meta["run_id"], meta, [r for r, _ in built], [t for _, toks in built for t in toks],
                     samples)


def _failed_run(root: Path) -> Path:
    """A server that never became healthy: the run's error quotes the server's own log."""
    log = root / "server.log"
    log.write_text(f"INFO starting\n(EngineCore pid=2) ERROR 11-29 [core.py:1] ValueError: {SCRIPT}\n{IMG}\n{ATTR}\n")
    error = "vLLM exited with code 1 before it was healthy. " + log_excerpt(log)
    return write_run(root / RUN_FAILED, run_meta(RUN_FAILED, f"failed {IMG}", "failed", 64, started=2, error=error))


@pytest.fixture(scope="module")
def hostile_report(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    db = root / "hostile.duckdb"
    ingest([_hostile_run(root), _failed_run(root)], db)
    write_diagnosis(db, DiagnosisRules())
    out = root / "report.html"
    render.render_report(QMD, db, out, engine="fallback")
    return out


class _Page(HTMLParser):
    """A page as the browser reads it: the images it loads, its event handlers, its script
    bodies, and the text it shows (entities decoded)."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.images: list[dict] = []
        self.handlers: list[tuple[str, str, str]] = []  # (tag, attribute, value)
        self.scripts: list[str] = []
        self.text: list[str] = []
        self.svg_text: list[str] = []  # what charts drew
        self._in: str | None = None  # inside <script> or <style>
        self._svg = 0
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs))
        self.handlers += [(tag, k, v or "") for k, v in attrs if k.startswith("on")]
        self._svg += tag == "svg"
        if tag in ("script", "style"):
            self._in = tag
            if tag == "script":
                self.scripts.append("")

    def handle_endtag(self, tag):
        self._svg -= tag == "svg"
        if tag == self._in:
            self._in = None

    def handle_data(self, data):
        if self._in == "script":
            self.scripts[-1] += data
        elif self._in is None:
            self.text.append(data)
            if self._svg:
                self.svg_text.append(data)


def assert_no_planted_markup(html: str) -> _Page:
    page = _Page(html)
    assert not [i for i in page.images if i.get("src") == "x"], page.images
    assert not [h for h in page.handlers if "alert(" in h[2]], page.handlers
    assert not [s for s in page.scripts if s.strip().startswith("alert(")]
    # '<' is escaped in any serialization; a '"' needs to be only inside attributes (the
    # notebook exporter re-serializes outputs and writes a text node's '"' as is)
    assert SCRIPT not in html and "<img src=x" not in html
    return page


def test_every_planted_string_is_escaped_in_the_report(hostile_report):
    html = hostile_report.read_text()
    page = assert_no_planted_markup(html)
    text = "".join(page.text)
    # shown, as text, exactly as planted (so the checks above can fail, and nothing was
    # escaped twice): the run's error quoting the server log, the description, the model
    # name and server argv in Setup, roles, the experiment, a trace's stats
    for payload in PAYLOADS:
        assert payload in text, f"never shown: {payload}"
    for shown in (f"ValueError: {SCRIPT}", f"config description {IMG}", f"model {SCRIPT}", "; rm -rf /",
                  f"designed for pattern {SCRIPT}", f"the knee of {ATTR}", f"interference {SCRIPT}"):
        assert shown in text, shown
    assert "&amp;lt;" not in html and "&amp;quot;" not in html and "&amp;amp;" not in html
    # chart data is JSON inside <script>: markup characters as \u escapes, never raw
    assert "\\u003cscript\\u003ealert(1)" in html


@pytest.mark.browser
def test_planted_strings_stay_text_in_the_browser(hostile_report, chromium, tmp_path):
    """After Vega drew the charts (roles in legends, errors in the data): still only text."""
    dom = chromium_run("--dump-dom", hostile_report.as_uri(), profile=tmp_path / "profile").stdout
    assert "ff-chart" in dom and "<svg" in dom  # the charts did draw
    drawn = "".join(assert_no_planted_markup(dom).svg_text)
    assert SCRIPT in drawn and IMG in drawn  # the roles, in the TTFT chart's legend, as text


# --- no config value reaches a shell -----------------------------------------------------------

# Calls that hand a string to /bin/sh, whatever their arguments.
_SHELL_FUNCS = {"os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput",
                "asyncio.create_subprocess_shell", "pty.spawn"}
_SUBPROCESS = {"subprocess.run", "subprocess.Popen", "subprocess.call", "subprocess.check_call",
               "subprocess.check_output", "asyncio.create_subprocess_exec"}


def _qualified(func: ast.expr, imported: dict[str, str]) -> str:
    """`sp.run` or `run` back to `subprocess.run`, through the module's imports."""
    name = ast.unparse(func)
    head, _, rest = name.partition(".")
    full = imported.get(head, head)
    return f"{full}.{rest}" if rest else full


def _process_calls(tree: ast.Module) -> list[tuple[str, ast.Call]]:
    imported: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update({a.asname or a.name: a.name for a in node.names})
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    return [(_qualified(n.func, imported), n) for n in ast.walk(tree) if isinstance(n, ast.Call)]


def _shell_uses(source: str, where: str) -> tuple[list[str], list[str]]:
    """(what hands a string to a shell, the subprocess calls seen) in one module."""
    bad, seen = [], []
    for name, call in _process_calls(ast.parse(source)):
        at = f"{where}:{call.lineno}"
        if name in _SHELL_FUNCS or name.endswith(".subprocess_shell"):
            bad.append(f"{at} {name}")
        if any(kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False)
               for kw in call.keywords):
            bad.append(f"{at} shell=")
        if name in _SUBPROCESS:
            seen.append(at)
            argv = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "args"), None)
            # a command line as one string is a shell's job: argv lists only
            if isinstance(argv, ast.JoinedStr) or (isinstance(argv, ast.Constant) and isinstance(argv.value, str)):
                bad.append(f"{at} {name} with a string")
    return bad, seen


def test_the_shell_scan_finds_what_it_looks_for():
    bad, _ = _shell_uses(
        "import os, subprocess as sp\nfrom os import system as run_it\n"
        "sp.run(cmd, shell=True)\nos.popen(cmd)\nrun_it(cmd)\nsp.check_output(f'ls {x}')\n", "x.py")
    assert [b.split(" ", 1)[1] for b in bad] == [
        "shell=", "os.popen", "os.system", "subprocess.check_output with a string"]


def test_no_shell_anywhere_in_the_package():
    bad, seen = [], []
    for path in sorted((REPO / "src").rglob("*.py")):
        b, s = _shell_uses(path.read_text(), str(path.relative_to(REPO)))
        bad += b
        seen += s
    assert bad == []
    # the scan did see the package's processes: vLLM, its guardian, Quarto, nvidia-smi
    assert {w.split(":")[0] for w in seen} >= {
        "src/filledfirst/engine/server.py", "src/filledfirst/engine/lifetime.py",
        "src/filledfirst/report/render.py", "src/filledfirst/run/provenance.py"}, seen


HOSTILE = {
    "name": "tiny; rm -rf /",
    "path": "data/models/$(touch PWNED)",
    "extra_args": ["--served-model-name", "`touch PWNED`", "; rm -rf / #", "a b", "'quoted'"],
    "env": "$(touch PWNED) && echo",
}


def _config_with(tmp_path: Path, edit) -> Path:
    cfg = config_module.config_files([REPO / "config" / "cpu.yaml"])
    edit(cfg)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _hostile(cfg: dict) -> None:
    cfg["model"].update(name=HOSTILE["name"], path=HOSTILE["path"])
    cfg["engine"]["server"]["extra_args"] = HOSTILE["extra_args"]
    cfg["engine"]["env"] = {"FF_HOSTILE": HOSTILE["env"]}


def _server_command(configfile: Path, monkeypatch, tmp_path: Path, experiment="decode_low"):
    """The command the runner builds for `experiment` of `configfile`, and the base URL."""
    monkeypatch.setattr(shared, "VllmServer", FakeVllm)
    spec = config_module.experiment_spec(as_study(config_module.load_config([configfile])), experiment)
    server = shared.SharedServer(spec.server_spec, tmp_path / "server.log")
    server.ready(experiment)
    return server.cmd, server.base_url


def test_config_values_reach_vllm_as_argv_elements_unchanged(tmp_path, monkeypatch):
    cmd, _ = _server_command(_config_with(tmp_path, _hostile), monkeypatch, tmp_path)
    assert isinstance(cmd.argv, list) and all(isinstance(a, str) for a in cmd.argv)
    assert cmd.argv[cmd.argv.index("--model") + 1] == HOSTILE["path"]
    assert cmd.argv[cmd.argv.index("--served-model-name") + 1] == HOSTILE["name"]
    n = len(HOSTILE["extra_args"])
    assert cmd.argv[-n:] == HOSTILE["extra_args"]  # in order, one element each, as written
    assert cmd.env["FF_HOSTILE"] == HOSTILE["env"]

    # ... and go to exec as that list: Popen gets it with no shell
    calls = record_popen(monkeypatch, server_module)
    VllmServer(cmd, host="127.0.0.1", port=1, log_path=tmp_path / "vllm.log", startup_timeout_s=1).start()
    (argv, kw), *guardian = calls
    assert argv == cmd.argv and not kw.get("shell") and kw["env"]["FF_HOSTILE"] == HOSTILE["env"]
    assert all(isinstance(a, list) and not k.get("shell") for a, k in guardian)


# --- servers listen on loopback unless the config says otherwise ---------------------------------


def _host(argv: list[str]) -> str:
    assert argv.count("--host") == 1, argv  # given exactly once: vLLM's own default is every address
    return argv[argv.index("--host") + 1]


@pytest.mark.parametrize("configfile, edit, expected", [
    ("cpu.yaml", None, "127.0.0.1"),
    ("cpu.yaml", lambda c: c["engine"].pop("host"), "127.0.0.1"),  # the schema's default
    ("config.yaml", None, "127.0.0.1"),  # the GPU study does not name a host
    ("cpu.yaml", lambda c: c["engine"].update(host="0.0.0.0"), "0.0.0.0"),  # said otherwise
])
def test_servers_listen_on_loopback_unless_the_config_says_otherwise(tmp_path, monkeypatch, configfile, edit, expected):
    path = REPO / "config" / configfile
    if edit:
        cfg = config_module.config_files([path])
        edit(cfg)
        path = tmp_path / configfile
        path.write_text(yaml.safe_dump(cfg))
    cmd, base_url = _server_command(path, monkeypatch, tmp_path)
    assert _host(cmd.argv) == expected
    assert base_url.startswith(f"http://{expected}:")


# --- the workflow layer: Snakemake's shell commands ---------------------------------------------


def _single_quoted(line: str) -> list[bool]:
    """Per character of a POSIX shell line: inside '...' (where nothing is special)?"""
    out, state, escaped = [], None, False
    for ch in line:
        if state == "'":
            out.append(ch != "'")
            state = None if ch == "'" else state
            continue
        out.append(False)
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            state = None if state == '"' else '"'
        elif ch == "'" and state is None:
            state = "'"
    return out


def test_config_values_reach_snakemake_shell_lines_only_single_quoted(tmp_path):
    """Names (experiments, workloads, traces) are refused by the schema unless they are
    identifiers (test_config_errors.py); a path can hold anything, and is quoted."""
    values = {"path": "data/models/tiny;touch PWNED_MODEL $(touch PWNED_SUB)"}

    def edit(cfg):
        cfg["model"]["path"] = values["path"]

    configfile = _config_with(tmp_path, edit)
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "workflow" / "Snakefile"),
         "--directory", str(tmp_path), "-n", "-p", "all", "--configfile", str(configfile)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if " -m filledfirst " in ln]
    assert len(lines) >= 4, proc.stdout  # model, workload, run, ingest (+ report)
    for line in lines:
        quoted = _single_quoted(line)
        for value in values.values():
            for m in re.finditer(re.escape(value), line):
                assert all(quoted[m.start():m.end()]), f"{value!r} unquoted in: {line}"
