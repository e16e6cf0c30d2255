"""The user docs hold together: every relative link in README.md and docs/*.md points to a
file that exists (and, for a link into a markdown file, to a heading it has), and every
docs page is linked from the README."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import REPO

DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.I)


def _prose(text: str) -> str:
    """The text without fenced code blocks and with code spans blanked: links are only
    read where markdown renders them."""
    text = FENCE.sub("", text)
    return CODE_SPAN.sub("code", text)


def links(text: str) -> list[str]:
    prose = _prose(text)
    return INLINE_LINK.findall(prose) + REFERENCE_DEF.findall(prose)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text lower-cased, punctuation dropped,
    spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    seen: dict[str, int] = {}
    found = set(HTML_ANCHOR.findall(text))
    for _, heading in HEADING.findall(text):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(path: Path) -> list[str]:
    """Each relative link of a markdown file that does not resolve, with why."""
    broken = []
    for target in links(path.read_text()):
        if SCHEME.match(target) or target.startswith("//"):
            continue  # a URL: not checked offline
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    return broken


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path):
    assert links(path.read_text()) or path.name != "README.md", f"{path} has no links at all"
    assert broken_links(path) == [], f"broken links in {path.relative_to(REPO)}"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(REPO / t.partition("#")[0]).resolve() for t in links((REPO / "README.md").read_text())}
    pages = set((REPO / "docs").glob("*.md"))
    assert pages, "no docs pages"
    assert {p.resolve() for p in pages} - linked == set()


def test_a_broken_link_is_caught(tmp_path):
    (tmp_path / "there.md").write_text("# A heading: with `code`, and more\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md) [ok](there.md#a-heading-with-code-and-more) [ok](there.md#twice-1)\n"
        "[ok](#local) [url](https://example.org/x) ![img](there.md)\n"
        "# Local\n"
        "`[not a link](missing-in-code.md)`\n"
        "```\n[not a link](missing-in-fence.md)\n```\n"
        "[gone](missing.md) [bad anchor](there.md#nowhere) ![gone](img/missing.png)\n"
        "[ref]: also-missing.md\n")
    assert [b.split(":")[0] for b in broken_links(page)] == [
        "missing.md", "there.md#nowhere", "img/missing.png", "also-missing.md"]
