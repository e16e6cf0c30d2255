"""The package's import graph keeps the layers docs/design.md documents: no import goes up
a layer, no cycle, every module placed."""

from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

import pytest

from conftest import REPO

PACKAGE = REPO / "src" / "filledfirst"


def documented_layers() -> dict[str, int]:
    """Top-level module or package -> its layer, from the table in docs/design.md#layers."""
    text = (REPO / "docs" / "design.md").read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    layers = {}
    for row in re.findall(r"^\| (\d+) [^|]*\| ([^|]*) \|", section, flags=re.M):
        for name in re.findall(r"`([\w.]+)`", row[1]):
            layers[name] = int(row[0])
    assert layers, "no layer table under '## Layers' in docs/design.md"
    return layers


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, source: str | None = None) -> set[str]:
    """The filledfirst modules `path` imports (relative imports resolved; `from a import b`
    counts as importing a.b when b is a module), at any depth: a function's import is an
    edge too."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    text = path.read_text() if source is None else source
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if package else []
                module = ".".join(base + ([node.module] if node.module else []))
                absolute = "filledfirst" + ("." + module if module else "")
            else:
                absolute = node.module or ""
            targets = [absolute] + [f"{absolute}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            if t == "filledfirst" or not t.startswith("filledfirst."):
                continue
            inner = t.removeprefix("filledfirst.")
            if (PACKAGE / inner.replace(".", "/")).with_suffix(".py").is_file() or (
                    PACKAGE / inner.replace(".", "/") / "__init__.py").is_file():
                out.add(inner)
    return out - {name}


def graph() -> dict[str, set[str]]:
    """module -> the modules it imports."""
    return {module_name(p): imports(p) for p in sorted(PACKAGE.rglob("*.py")) if module_name(p)}


def layer_of(module: str, layers: dict[str, int]) -> int | None:
    top = module.split(".")[0]
    return layers.get(module, layers.get(top))


def test_every_module_has_a_documented_layer():
    layers = documented_layers()
    unplaced = sorted(m for m in graph() if layer_of(m, layers) is None)
    assert not unplaced, f"modules docs/design.md#layers does not place: {unplaced}"


def test_no_import_goes_up_a_layer():
    layers = documented_layers()
    up = [f"{a} (layer {layer_of(a, layers)}) imports {b} (layer {layer_of(b, layers)})"
          for a, targets in graph().items() for b in targets if (layer_of(a, layers) or 0) < (layer_of(b, layers) or 0)]
    assert not up, "imports from a lower layer up to a higher one:\n" + "\n".join(sorted(up))


def test_no_import_cycle():
    try:
        graphlib.TopologicalSorter(graph()).prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"an import cycle: {' -> '.join(exc.args[1])}")


@pytest.mark.parametrize("source, expected", [
    ("from filledfirst.loadgen import scrape\n", {"loadgen", "loadgen.scrape"}),
    ("from . import sender\n", {"loadgen", "loadgen.sender"}),
    ("def f():\n    from filledfirst.run.runner import Runner\n", {"run.runner"}),
    ("import filledfirst.metrics\n", {"metrics"}),
])
def test_the_graph_sees_every_form_of_import(source, expected):
    """The checks above are only as good as the edges: each form of import is one."""
    fake = PACKAGE / "loadgen" / "replay.py"
    assert imports(fake, source) == expected

