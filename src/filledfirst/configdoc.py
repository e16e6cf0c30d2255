"""config/README.md, written from the config schema: every section and key, its type,
default and meaning. `python -m filledfirst.configdoc > config/README.md` regenerates it;
tests/config/test_study.py fails while the file and the schema disagree."""

from __future__ import annotations

import functools
import json
import sys

from filledfirst.schema import config_schema

HEADER = """# Configuring a study

A study is one YAML file (or several given one after the other with `--configfile`,
later files overriding earlier ones key by key). A file may begin with `extends: <file>`
(relative to it): it is then layered over that file the same way, key by key, a list
replaced whole. The study is checked against `src/filledfirst/schemas/config.schema.yaml`
before anything runs; unknown keys are errors. `config/study.yaml` is the original study,
defined once; `config/config.yaml` (a GPU) and `config/cpu.yaml` (a CPU) extend it with a
machine's model, engine and sizes.

This file is generated from the schema (`python -m filledfirst.configdoc > config/README.md`);
a test fails when the two disagree. A default is the schema's, or, where the schema cannot
hold one (the workload kinds), `filledfirst.study`'s, named in the description.
`<name>` below stands for any name you choose (letters, digits and underscores, not
starting with a digit).
"""


def _resolve(node: dict, schema: dict) -> dict:
    ref = node.get("$ref")
    if ref:
        target = schema
        for part in ref.removeprefix("#/").split("/"):
            target = target[part]
        return {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _type(node: dict, schema: dict) -> str:
    node = _resolve(node, schema)
    if "oneOf" in node and "type" not in node:  # a number, or a rate relative to a knee
        return " or ".join(_type(branch, schema) for branch in node["oneOf"])
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    if "const" in node:
        return f"`{node['const']}`"
    kind = node.get("type")
    if isinstance(kind, list):
        kind = " or ".join(kind)
    if kind == "array":
        return f"list of {_type(node.get('items', {}), schema)}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict) and "properties" not in node:
        return f"map of {_type(node['additionalProperties'], schema)}"
    bounds = [f"{sym} {node[key]}" for key, sym in (("minimum", ">="), ("exclusiveMinimum", ">"),
                                                    ("maximum", "<="), ("exclusiveMaximum", "<"))
              if key in node]
    return (kind or "see below") + (f" ({', '.join(bounds)})" if bounds else "")


def _text(value: str | None) -> str:
    return " ".join((value or "").split()).replace("|", "\\|")


def _type_defaults() -> dict[str, dict]:
    """Defaults the schema cannot hold (the workload kinds are a oneOf), from the types."""
    import msgspec

    from filledfirst import study

    def of(cls) -> dict:
        return {f.name: f.default for f in msgspec.structs.fields(cls)
                if f.default is not msgspec.NODEFAULT and f.default not in (None, "")}

    return {"trace": of(study.TraceWorkload), "synthetic": of(study.SyntheticWorkload),
            "phase": of(study.SyntheticPhase)}


def _section(title: str, node: dict, schema: dict, out: list[str], type_defaults: dict | None = None) -> None:
    """One table of keys, then a table for each key that is itself an object."""
    node = _resolve(node, schema)
    if "if" in node:  # experiments.*.server: vLLM settings, or an external endpoint
        _section(f"{title} (vLLM settings on top of engine.server)", node["else"], schema, out)
        _section(f"{title} (an external endpoint)", node["then"], schema, out)
        return
    if "oneOf" in node:
        branches = [_resolve(b, schema) for b in node["oneOf"]]
        if all("kind" in b.get("properties", {}) for b in branches):  # the workload kinds
            for branch in branches:
                kind = branch["properties"]["kind"]["const"]
                _section(f"{title} (kind: {kind})", branch, schema, out, _TYPE_DEFAULTS()[kind])
            return
        # a value or a map of objects (`sections`: a file name or the sections inline): the objects
        objects = [b for b in branches if b.get("type") == "object"]
        if objects:
            _section(title, objects[0], schema, out)
        return
    if "properties" not in node:
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            _section(title + ".NAME", extra, schema, out)
        elif node.get("type") == "array":
            _section(title + "[]", node["items"], schema, out, _TYPE_DEFAULTS()["phase"])
        return
    required = set(node.get("required", []))
    if "." in title or " (" in title:  # a top-level section's heading is its `##` one
        out.append(f"\n### {title.replace('.NAME', '.<name>')}\n")
    else:
        out.append("")
    if node.get("description"):
        out.append(_text(node["description"]) + "\n")
    out.append("| key | type | required | default | meaning |\n|---|---|---|---|---|")
    nested = []
    for key, child in node["properties"].items():
        child_r = _resolve(child, schema)
        if "default" in child_r:
            default = f"`{json.dumps(child_r['default'])}`"
        elif type_defaults and key in type_defaults:
            default = f"`{json.dumps(type_defaults[key])}`"
        else:
            default = ""
        out.append(f"| `{key}` | {_type(child, schema)} | {'yes' if key in required else ''} | {default} | "
                   f"{_text(child_r.get('description'))} |")
        items = _resolve(child_r.get("items", {}), schema)
        extra = child_r.get("additionalProperties")
        # a key that is a number or an object (a rate relative to a knee): the object's table
        objects = [b for b in map(lambda b: _resolve(b, schema), child_r.get("oneOf", [])) if "properties" in b]
        if objects and "type" not in child_r and key != "kind":
            nested.append((key, objects[0]))
            continue
        if ("properties" in child_r or "if" in child_r or "properties" in items
                or (isinstance(extra, dict) and "properties" in _resolve(extra, schema))):
            nested.append((key, child_r))
    for key, child in nested:
        _section(f"{title}.{key}", child, schema, out)


_TYPE_DEFAULTS = functools.lru_cache(maxsize=1)(_type_defaults)


def _diagnosis_rules(node: dict, out: list[str]) -> None:
    """The `diagnosis` section: every threshold with its default and meaning, from
    filledfirst.study.DiagnosisRules (the schema takes any of them by name)."""
    import dataclasses

    from filledfirst.study import DiagnosisRules

    out.append("")
    out.append(_text(node.get("description")) + " " + _text(DiagnosisRules.__doc__.split("\n\n")[-1]) + "\n")
    out.append("| key | default | meaning |\n|---|---|---|")
    for field in dataclasses.fields(DiagnosisRules):
        out.append(f"| `{field.name}` | `{json.dumps(field.default)}` | {_text(field.metadata['meaning'])} |")


def render(schema: dict | None = None) -> str:
    schema = schema if schema is not None else config_schema()
    out = [HEADER, "## Sections\n", "| section | required | meaning |\n|---|---|---|"]
    required = set(schema.get("required", []))
    for key, node in schema["properties"].items():
        out.append(f"| [`{key}`](#{key}) | {'yes' if key in required else ''} | "
                   f"{_text(_resolve(node, schema).get('description'))} |")
    for key, node in schema["properties"].items():
        out.append(f"\n## {key}")
        node_r = _resolve(node, schema)
        if key == "diagnosis":
            _diagnosis_rules(node, out)
        elif node_r.get("type") in ("boolean", "number", "integer", "string"):  # a key of its own
            default = f"`{json.dumps(node_r['default'])}`" if "default" in node_r else ""
            out.append(f"\n{_text(node_r.get('description'))}\n\n| key | type | default |\n|---|---|---|\n"
                       f"| `{key}` | {_type(node, schema)} | {default} |")
        else:
            if "properties" not in node_r and node_r.get("description"):  # a map: its meaning, then its entries'
                out.append(f"\n{_text(node_r['description'])}")
            _section(key, node, schema, out)
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
