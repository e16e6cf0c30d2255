"""What the user docs name exists: every `filledfirst ...` command line in README.md and
docs/*.md names real sub-commands and options of the CLI, and every table the README
lists is in a database the pipeline writes."""

from __future__ import annotations

import argparse
import re
import shlex

import duckdb
import pytest

from filledfirst.analysis.frontiers import write_frontiers
from filledfirst.cli import build_parser

from conftest import REPO
from helpers.report_runs import report_db, report_runs

DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])

FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1", re.S | re.M)
CODE_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
# a command line: from `filledfirst` (or `python -m filledfirst`) to the end of the code
COMMAND = re.compile(r"(?:^|[\s(])(?:python -m |\.venv/bin/)?filledfirst\s+([a-z].*)")


def command_lines(text: str) -> list[str]:
    """The argument part of each `filledfirst` command line in a page's code."""
    code = [line for _, block in FENCE.findall(text) for line in block.splitlines()]
    code += CODE_SPAN.findall(FENCE.sub("", text))
    return [m.group(1) for piece in code if (m := COMMAND.search(piece))]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def problems(args: str, parser: argparse.ArgumentParser) -> list[str]:
    """What in one documented command line the CLI does not have."""
    try:
        words = shlex.split(args.replace("[", " ").replace("]", " ").replace("|", " "), comments=True)
    except ValueError:
        words = args.split()
    found, path = [], ["filledfirst"]
    while (subs := _subparsers(parser)) and words:
        if words[0] not in subs:
            if words[0].isidentifier() and words[0].islower():
                found.append(f"{' '.join(path)}: no sub-command {words[0]!r}")
            return found
        path.append(words.pop(0))
        parser = subs[path[-1]]
    options = {s for action in parser._actions for s in action.option_strings}
    for word in words:
        if word in (";", "&&", "|", ">", "2>&1"):
            break  # the next command
        option = word.split("=", 1)[0]
        if option.startswith("--") and len(option) > 2 and re.fullmatch(r"--[a-z][a-z0-9-]*", option):
            if option not in options:
                found.append(f"{' '.join(path)}: no option {option}")
    return found


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_documented_command_exists(path):
    parser = build_parser()
    wrong = [p for line in command_lines(path.read_text()) for p in problems(line, parser)]
    assert wrong == [], f"{path.relative_to(REPO)} documents what the CLI does not have"


CONFIGFILE = re.compile(r"--configfile\s+(\S+\.yaml)")


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_documented_config_is_a_valid_study(path):
    """The configs a page's commands run (`snakemake ... --configfile config/X.yaml`) exist
    and are studies the workflow accepts."""
    from filledfirst.config import load_study
    from filledfirst.plan import build_plan

    code = "\n".join(block for _, block in FENCE.findall(path.read_text()))
    code += "\n".join(CODE_SPAN.findall(FENCE.sub("", path.read_text())))
    for name in dict.fromkeys(CONFIGFILE.findall(code)):
        if name.startswith("config/"):  # the shipped ones; a page's own example is the reader's
            assert build_plan(load_study([REPO / name])).jobs, name


def test_the_pages_do_document_commands():
    """The check reads something: the README's command table and the CLI reference."""
    assert len(command_lines((REPO / "README.md").read_text())) >= 10
    assert len(command_lines((REPO / "docs" / "cli.md").read_text())) >= 10


def test_a_wrong_command_or_option_is_caught():
    parser = build_parser()
    assert problems("trace subsample CSV --minutes M --out P", parser) == []
    assert problems("trace resample CSV", parser) == ["filledfirst trace: no sub-command 'resample'"]
    assert problems("ingest --db FILE --glob x DIR", parser) == ["filledfirst ingest: no option --glob"]
    assert command_lines("run `filledfirst report --db x --out y`, then\n```sh\nfilledfirst nope --x\n```\n") == [
        "nope --x", "report --db x --out y"]


def test_every_table_the_readme_lists_is_in_the_database(tmp_path):
    readme = (REPO / "README.md").read_text()
    listing = readme[readme.index("**`results/filledfirst.duckdb`**"):]
    listing = listing[:listing.index("\n- **")]
    documented = set(re.findall(r"`([a-z_]+)`", listing))
    assert {"runs", "requests", "diagnosis"} <= documented
    db = report_db(tmp_path / "study.duckdb", report_runs(tmp_path))
    write_frontiers(db)  # as `filledfirst diagnose` does
    with duckdb.connect(str(db), read_only=True) as con:
        tables = {name for (name,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert documented - tables == set()
