"""The run.json sections of the report's setup part: each run's document flattened to
dotted keys, what every run shares and what differs, as tables.

The document is read whole here, unknown keys included (its typed view,
filledfirst.contracts.runmeta.RunMeta, keeps only what the package reads): a JSON object,
whose values are checked before use."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from filledfirst.analysis.numbers import DASH
from filledfirst.report.markup import html_table

JsonObject = Mapping[str, object]  # a JSON document's object, any of its values


def fmt_value(v: object) -> str:
    """Setup values from run.json: lists as shell-like words, the rest as text."""
    if v is None:
        return DASH
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, list):
        return " ".join(shlex.quote(str(x)) for x in v)
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.1f}"  # timings, not 17 digits
    return str(v)


def flatten(d: JsonObject, prefix: str = "") -> dict[str, object]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists stay values (argv reads better whole)."""
    out: dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def section(meta: JsonObject, path: str) -> dict[str, object]:
    """The flattened sub-dict at a dotted path of run.json, {} if absent."""
    node: object = meta
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return flatten(node) if isinstance(node, Mapping) else {}


def split_common(per_run: Mapping[str, JsonObject]) -> tuple[dict[str, object], list[str]]:
    """Keys every run agrees on (shown once) and the keys that differ (shown per run)."""
    keys: list[str] = []
    for values in per_run.values():
        keys += [k for k in values if k not in keys]
    common: dict[str, object] = {}
    differing: list[str] = []
    runs = list(per_run.values())
    for k in keys:
        vals = [r.get(k) for r in runs]
        if all(k in r for r in runs) and all(v == vals[0] for v in vals):
            common[k] = vals[0]
        else:
            differing.append(k)
    return common, differing


def key_value_table(values: JsonObject, caption: str | None = None) -> str:
    return html_table(["", "value"], ((k, fmt_value(v)) for k, v in values.items()), caption=caption)


def keys_by_run_table(
    per_run: Mapping[str, JsonObject], keys: Sequence[str], caption: str | None = None
) -> str:
    """Keys as rows, runs as columns: the seed's side-by-side comparison shape."""
    rows = ([k, *(fmt_value(v.get(k)) for v in per_run.values())] for k in keys)
    return html_table(["", *per_run], rows, caption=caption)
